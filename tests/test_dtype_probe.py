"""model.dtype auto on a CPU: chosen by measuring both dtypes on the model's shapes, cached."""

from __future__ import annotations

import json
import time

import pytest
import torch

from jobrunner.config import ModelConfig
from jobrunner.engine import dtype_probe
from jobrunner.engine.loader import load_model, pick_dtype
from jobrunner.engine.paged.small_linear import SmallRowLinear
from jobrunner.telemetry.device import cpu_name


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    # only the choice's cache moves: the model's converted weights stay in the user's cache
    path = tmp_path / "jobrunner" / dtype_probe.CACHE_FILE
    monkeypatch.setattr(dtype_probe, "_cache_path", lambda: path)
    return path


def fake_timings(monkeypatch, f32: float, bf16: float) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []

    def timed(hidden, intermediate):
        calls.append((hidden, intermediate))
        return {"float32": f32, "bfloat16": bf16}

    monkeypatch.setattr(dtype_probe, "_has_native_bf16", lambda: True)
    monkeypatch.setattr(dtype_probe, "_time_dtypes", timed)
    return calls


@pytest.mark.parametrize(
    ("f32", "bf16", "chosen"),
    [(2.0, 1.0, "bfloat16"), (1.1, 1.0, "float32"), (1.0, 3.0, "float32")],
)
def test_bfloat16_is_chosen_only_when_it_is_clearly_faster(monkeypatch, f32, bf16, chosen):
    fake_timings(monkeypatch, f32, bf16)
    choice = dtype_probe.measure(576, 1536)
    assert choice.dtype == chosen
    assert f"{f32 / bf16:.2f}x" in choice.reason and cpu_name() in choice.reason


def test_a_cpu_without_bfloat16_instructions_keeps_float32_without_measuring(monkeypatch):
    monkeypatch.setattr(dtype_probe, "_has_native_bf16", lambda: False)
    monkeypatch.setattr(dtype_probe, "_time_dtypes", lambda *a, **k: pytest.fail("measured"))
    choice = dtype_probe.measure(576, 1536)
    assert choice.dtype == "float32" and "no bfloat16 instructions" in choice.reason


def test_the_choice_is_measured_once_per_cpu_thread_count_and_shape(monkeypatch, cache_home):
    calls = fake_timings(monkeypatch, 2.0, 1.0)
    first = dtype_probe.choose_cpu_dtype(576, 1536)
    assert dtype_probe.choose_cpu_dtype(576, 1536) == first
    assert calls == [(576, 1536)]  # the second answer came from the cache
    (key,) = json.loads(cache_home.read_text())
    assert cpu_name() in key and f"{torch.get_num_threads()} threads" in key
    dtype_probe.choose_cpu_dtype(2048, 8192)  # another model shape is measured anew
    assert len(calls) == 2


def test_an_unwritable_cache_only_means_measuring_again(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the cache's folder must go
    monkeypatch.setattr(dtype_probe, "_cache_path", lambda: blocker / dtype_probe.CACHE_FILE)
    calls = fake_timings(monkeypatch, 1.0, 2.0)
    assert dtype_probe.choose_cpu_dtype(576, 1536).dtype == "float32"
    assert dtype_probe.choose_cpu_dtype(576, 1536).dtype == "float32"
    assert len(calls) == 2


def test_the_real_measurement_times_each_dtype_after_packing_its_weights(monkeypatch):
    # Packing is a one-time cost at load, not part of a step: a probe that timed it made a
    # bfloat16 kernel look 8x slower than float32 and kept float32 on a CPU where bf16 wins.
    events: list[str] = []
    pack, timed = SmallRowLinear._pack, dtype_probe._pass
    monkeypatch.setattr(
        SmallRowLinear, "_pack", lambda self, w: events.append("pack") or pack(self, w)
    )
    monkeypatch.setattr(dtype_probe, "_pass", lambda *a: events.append("timed") or timed(*a))
    per_token = dtype_probe._time_dtypes(576, 1536)  # SmolLM2's shapes
    assert per_token["float32"] > 0 and per_token["bfloat16"] > 0
    assert "pack" in events and "timed" in events  # float32 always takes the packed path
    assert "pack" not in events[events.index("timed") :]  # every weight packed before timing


def test_auto_on_cpu_loads_the_built_in_model_in_the_chosen_dtype(monkeypatch, cache_home):
    fake_timings(monkeypatch, 2.0, 1.0)  # as a CPU where bfloat16 wins
    loaded = load_model(ModelConfig(dtype="auto"))
    assert loaded.dtype == torch.bfloat16
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.dtype_reason.startswith("auto: measured on")


def test_a_named_dtype_is_taken_as_given():
    assert pick_dtype("float32", torch.device("cpu")) == (torch.float32, "model.dtype")


def test_the_measurement_runs_on_one_thread_and_gives_the_threads_back(monkeypatch):
    # On two threads under another process's load, a kernel waits at each barrier for the
    # thread the scheduler took: float32 measured 10x its quiet time and bfloat16, 2x faster
    # alone, lost. One thread's CPU time is what other processes do not inflate.
    seen: list[int] = []
    timed = dtype_probe._pass
    monkeypatch.setattr(
        dtype_probe, "_pass", lambda *a: seen.append(torch.get_num_threads()) or timed(*a)
    )
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        dtype_probe._time_dtypes(64, 128)
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_measurement_counts_as_first_use_work_and_a_cached_choice_does_not(
    monkeypatch, cache_home
):
    """`estimate --calibrate` leaves first-use work out of the load it records for later runs,
    which find the choice cached."""
    from jobrunner.engine import first_use

    def slow(hidden, intermediate):
        time.sleep(0.05)
        return {"float32": 2.0, "bfloat16": 1.0}

    monkeypatch.setattr(dtype_probe, "_has_native_bf16", lambda: True)
    monkeypatch.setattr(dtype_probe, "_time_dtypes", slow)
    before = first_use.spent()
    dtype_probe.choose_cpu_dtype(576, 1536)
    measured = first_use.spent()
    assert measured - before >= 0.05
    dtype_probe.choose_cpu_dtype(576, 1536)  # cached now
    assert first_use.spent() == measured


def test_first_use_work_nested_in_first_use_work_counts_once():
    """The probe builds the kernels inside its own timed block: the build is not counted twice."""
    from jobrunner.engine import first_use

    before, t0 = first_use.spent(), time.monotonic()
    with first_use.timed():
        time.sleep(0.02)
        with first_use.timed():
            time.sleep(0.05)
    outer = time.monotonic() - t0
    counted = first_use.spent() - before
    assert 0.07 <= counted <= outer  # twice the inner block would exceed the outer one
