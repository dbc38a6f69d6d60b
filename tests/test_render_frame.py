"""The chat template is rendered once per job for plain user texts: the result is the exact
string Jinja renders per row, and templates that inspect the content keep the per-row path."""

from __future__ import annotations

import copy

import pytest

from jobrunner.config import InputConfig, ModelConfig
from jobrunner.prep.render import PromptRenderer


@pytest.fixture(scope="module")
def tok():
    from jobrunner.engine.loader import load_tokenizer

    return load_tokenizer(ModelConfig())


TEXTS = ["Write one word that rhymes with apple 0.", "x", "Two\nlines", "  padded ", "<b>hi</b>"]


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_framed_user_turn_equals_the_template(tok, system):
    r = PromptRenderer(InputConfig(system_prompt=system), tok)
    assert r._frame is not None
    for text in TEXTS:
        assert r.render({"prompt": text}) == r.chat([{"role": "user", "content": text}])


def test_a_template_that_inspects_content_is_rendered_per_row(tok):
    trimming = copy.copy(tok)
    trimming.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}"
    )
    r = PromptRenderer(InputConfig(), trimming)
    assert r.render({"prompt": "a  b "}) == "<user>a  b</user>"  # not plain: Jinja renders it
    branching = copy.copy(tok)
    branching.chat_template = (
        "{% for m in messages %}{% if 'line' in m.content %}[multi]{% endif %}"
        "{{ m.content }}{% endfor %}"
    )
    r = PromptRenderer(InputConfig(), branching)
    assert r._frame is None
    assert r.render({"prompt": "one line"}) == "[multi]one line"


def test_framed_prompts_tokenize_as_the_whole_text(tok):
    from jobrunner.config import JobConfig
    from jobrunner.io.readers import RawRow
    from jobrunner.prep.prepare import Preparer
    from jobrunner.types import RowRef

    p = Preparer(JobConfig(), tok)
    assert p.renderer.frame_token_ids is not None
    rows = [RawRow({"id": f"r{i}", "prompt": t}, RowRef("f", i)) for i, t in enumerate(TEXTS)]
    for req in p.prepare_batch(rows):
        assert req.prompt_token_ids == tok(req.prompt, add_special_tokens=False)["input_ids"]
