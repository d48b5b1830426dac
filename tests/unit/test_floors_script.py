"""scripts/floors.py: which variants it times by default, and the floor arithmetic of its table."""
from _scripts import load_script

from helios.kernels.build import cpu_isa

floors = load_script("floors")


def test_default_variants_are_those_this_cpu_runs_widest_first_without_generic_unless_it_is_the_only_one():
    variants = floors.runnable_variants()
    assert variants[0] == cpu_isa() and variants == sorted(variants, key=list(floors.ISA_FLAGS).index)
    assert ("generic" in variants) == (cpu_isa() == "generic")


def test_the_table_divides_by_the_floors():
    run = dict(isa="avx2", matmuls="C, float16 weights, AVX2", params=100, weight_bytes=200,
               rounds=[dict(decode_tok_s=d, prefill_tok_s=p, matmul_flop_s=f) for d, p, f in
                       [(4.0, 40.0, 8000.0), (5.0, 50.0, 10000.0), (6.0, 45.0, 9000.0)]],
               median=dict(decode_tok_s=5.0, prefill_tok_s=45.0, matmul_flop_s=9000.0))
    data = dict(machine=dict(cpu="Some CPU", cpus=2, flags=["avx2"], torch="2"), threads=2, repeat=3,
                load_before="0.1", load_after="0.2", probe=dict(matmul_flop_s=20000.0, memory_bytes_s=2000.0),
                variants=[run])
    row = next(line for line in floors.report(data).splitlines() if line.startswith("| avx2 |"))
    # read floor 2000 B/s / 200 B = 10 tok/s; PyTorch-rate floor 20000 / 200 = 100; the variant's 9000 / 200 = 45
    assert row == ("| avx2 | C, float16 weights, AVX2 | 5.0 (4.0–6.0) | 50% of 10 | 45 (40–50) | 45% of 100 | 0 "
                   "| 100% of 45 |")
    assert "--variants avx2" in floors.report(data)
