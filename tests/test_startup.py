"""Start-up: commands that need no model import no torch, and the torch-free tokenizer load of
a GGUF's cache gives the tokenizer AutoTokenizer gives (checked in subprocesses, by
sys.modules, never by timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SAMPLES, write_job

CHECK = """
import sys
sys.argv = ["jobrunner", *{args!r}]
from jobrunner.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps({{m: m in sys.modules for m in ("torch", "transformers")}}), file=sys.stderr)
"""


def imported(*args: str) -> dict[str, bool]:
    """Which heavy modules `jobrunner ARGS` imported, in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import json\n" + CHECK.format(args=list(args))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    return json.loads(done.stderr.strip().splitlines()[-1])


def test_help_imports_neither_torch_nor_transformers():
    assert imported("--help") == {"torch": False, "transformers": False}
    assert imported("run", "--help") == {"torch": False, "transformers": False}


def test_validate_of_the_built_in_model_does_not_import_torch(model_f32, tmp_path):
    # model_f32 made the GGUF's cache; validate reads its tokenizer only
    job = write_job(
        tmp_path / "job.yaml",
        f"input: {{path: {SAMPLES / 'prompts.jsonl'}}}\noutput: {{path: {tmp_path / 'out'}}}\n",
    )
    assert imported("validate", str(job))["torch"] is False


def test_a_gguf_caches_tokenizer_loads_as_autotokenizer_loads_it(model_f32):
    from transformers import AutoTokenizer

    from jobrunner.engine.loader import _is_gguf_cache, _tokenizer

    where = model_f32.weights_dir
    if not _is_gguf_cache(where):
        pytest.skip("the built-in model comes from the HF cache here, not from its GGUF")
    ours, auto = _tokenizer(where, False, None), AutoTokenizer.from_pretrained(where)
    assert type(ours) is type(auto)
    assert (len(ours), ours.all_special_ids, ours.chat_template) == (
        len(auto),
        auto.all_special_ids,
        auto.chat_template,
    )
    texts = [json.loads(x)["prompt"] for x in (SAMPLES / "prompts.jsonl").open()][:20]
    texts += ["<|im_start|>user\nhi<|im_end|>", "  spaces\tand 12345 digits ünïcode"]
    for t in texts:
        assert ours(t)["input_ids"] == auto(t)["input_ids"]
        chat = [{"role": "user", "content": t}]
        assert ours.apply_chat_template(chat, tokenize=False) == auto.apply_chat_template(
            chat, tokenize=False
        )


STOPPED_EARLY = """
import os, signal, time
from jobrunner.entry import install
install()  # what the command does first, before the CLI's imports
os.kill(os.getpid(), signal.{name})
import jobrunner.cli  # the imports a signal may interrupt
time.sleep(30)
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_during_start_up_exits_75(name):
    """A scheduler's SIGTERM (or a Ctrl-C) while the command still imports: exit 75, "run
    again", not the signal's own status (143, 130). The installed command starts there."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", STOPPED_EARLY.format(name=name)], env=env, timeout=60)
    assert p.returncode == 75
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'jobrunner = "jobrunner.entry:main"' in pyproject
