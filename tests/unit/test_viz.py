"""The scheduler's tick view, without a browser: text when no kernel is running, a slider widget otherwise."""
import pytest

from helios.config import EngineConfig
from helios.kv.manager import PageManager
from helios.kv.prefix_cache import PrefixCache
from helios.scheduler import Scheduler, Sequence, TickPlan
from helios.viz import show_ticks, tick_state, tick_widget, widgets_live


def two_ticks():
    "A 5-token prompt on pages of 4: prefilled in the first tick, finished before the second."
    sched = Scheduler(EngineConfig(max_batch_size=2, prefill_chunk_size=8, page_size=4),
                      PageManager(3, 4, PrefixCache(ttl_s=60)), max_model_len=64)
    seq = Sequence(0, "A", [1, 2, 3, 4, 5], 2, 0.0, page_size=4)
    sched.add([seq])
    plan = sched.schedule(0.0)
    sched.on_computed(plan, 0.0)
    first = tick_state(0, sched, plan)
    sched.finish(seq, 0.0)
    return [first, tick_state(1, sched, TickPlan([]))]


def test_static_view_prints_every_tick(capsys):
    assert not widgets_live()  # pytest is not a Jupyter kernel
    show_ticks(two_ticks())    # interactive=None: decides by itself, and prints here
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "tick  0: A prefill 0-4" and lines[3].split() == ["A*", "A", "."]
    assert lines[4] == "tick  1: nothing ran" and lines[5].split() == ["~", ".", "."]


def test_widget_follows_the_slider():
    pytest.importorskip("ipywidgets")
    view = tick_widget(two_ticks())
    slider, picture = view.children[0].children[1], view.children[1]
    assert "tick 0" in picture.value and "A prefill 0-4" in picture.value
    slider.value = 1
    assert "tick 1" in picture.value and "nothing ran" in picture.value
