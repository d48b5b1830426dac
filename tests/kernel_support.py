"""What the kernel tests share: they skip where the C kernels cannot be built (no compiler), unless
HELIOS_REQUIRE_KERNELS=1 is set (CI installs gcc), where a kernel that does not build fails them instead."""
import functools
import os

import pytest


def kernels_required() -> bool:
    "True when HELIOS_REQUIRE_KERNELS=1: a kernel that cannot be built is a failure, not a reason to skip."
    return os.environ.get("HELIOS_REQUIRE_KERNELS") == "1"


def builds(build) -> str | None:
    "None if build() succeeds, else why not (the KernelUnavailable's message)."
    from helios.kernels.build import KernelUnavailable
    try:
        build()
        return None
    except KernelUnavailable as e:
        return str(e)


def needs_kernels(why_not: str | None):
    "A decorator for tests that need a kernel: as is where it builds; else skipped, or failed under HELIOS_REQUIRE_KERNELS=1."
    def mark(test):
        if why_not is None: return test
        if not kernels_required(): return pytest.mark.skip(reason=f"the C kernels do not build here: {why_not}")(test)
        @functools.wraps(test)
        def fails(*args, **kwargs): pytest.fail(f"HELIOS_REQUIRE_KERNELS=1, but the C kernels do not build: {why_not}")
        return fails
    return mark


def skip_or_fail(reason: str):
    "Inside a test: skip for this reason, or fail under HELIOS_REQUIRE_KERNELS=1."
    if kernels_required(): pytest.fail(f"HELIOS_REQUIRE_KERNELS=1, but {reason}")
    pytest.skip(reason)
