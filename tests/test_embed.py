"""`task: embed`: vectors equal HF transformers' and sentence-transformers' own, in any batch.

The oracle is the HF model (AutoModel) plus the same pooling, one text at a time in float32,
and sentence-transformers' `encode` on the same model directory.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from jobrunner.config import JobConfig, ModelConfig
from jobrunner.engine.embed.encoder import length_runs
from jobrunner.engine.embed.engine import finish_vector, length_batches
from jobrunner.engine.embed.pooling import pool
from jobrunner.engine.embed.st_files import pooling_mode, st_max_seq_length, st_pooling
from jobrunner.engine.engines import make_engine
from jobrunner.engine.loader import load_model
from jobrunner.errors import ConfigError
from jobrunner.prep.embed import EMBED_SAMPLING
from jobrunner.types import Request
from tests.conftest import SAMPLES

MAX_COSINE_DISTANCE = 1e-5


def mixed_texts(n: int, seed: int = 0) -> list[str]:
    """n texts of 1 to ~60 words cut from the sample corpus (mixed lengths, some repeated
    lengths, a few one-word texts)."""
    import pyarrow.parquet as pq

    words = " ".join(pq.read_table(SAMPLES / "prompts.parquet").column("prompt").to_pylist())
    words = words.split()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        size = int(2 ** rng.uniform(0, 5.9))
        start = rng.randrange(len(words) - size)
        out.append(" ".join(words[start : start + size]))
    return out


def cosine_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 1 - F.cosine_similarity(a.double(), b.double(), dim=-1)


def embed_all(engine, tokenizer, texts: list[str]) -> torch.Tensor:
    ids = tokenizer(texts)["input_ids"]
    reqs = [Request(str(i), list(x), EMBED_SAMPLING) for i, x in enumerate(ids)]
    got = {r.id: r for r in engine.generate(reqs)}
    assert all(r.ok for r in got.values())
    return torch.tensor([got[str(i)].embedding for i in range(len(texts))])


def embed_cfg(**kw) -> JobConfig:
    cfg = JobConfig.model_validate({"task": "embed", **kw})
    cfg.model.dtype = "float32"
    return cfg


@pytest.fixture(scope="module")
def minilm():
    return load_model(ModelConfig(source="all-minilm-l6-v2", dtype="float32"))


# ------------------------------------------------------------------ correctness


def test_minilm_equals_hf_one_text_at_a_time_in_mixed_batches(minilm):
    """64+ texts of mixed length, packed into batches of mixed lengths (a small token budget
    makes many), against HF's BertModel + mean pooling on each text alone."""
    texts = mixed_texts(72)
    cfg = embed_cfg(engine={"max_batch_tokens": 600, "order_window": 50})
    engine = make_engine(minilm, cfg)
    ours = embed_all(engine, minilm.tokenizer, texts)
    assert engine.stats.steps >= 6  # several batches, each of several lengths
    refs = []
    with torch.inference_mode():
        for t in texts:
            enc = minilm.tokenizer(t, return_tensors="pt")
            h = minilm.model(**enc).last_hidden_state[0]  # (L, D)
            refs.append(F.normalize(h.mean(0), dim=0))
    dist = cosine_distance(ours, torch.stack(refs))
    assert dist.max().item() < MAX_COSINE_DISTANCE, dist.max()
    assert ours.shape == (72, 384)
    assert torch.allclose(ours.norm(dim=1), torch.ones(72), atol=1e-5)


def test_minilm_equals_sentence_transformers_encode(minilm):
    from sentence_transformers import SentenceTransformer

    texts = mixed_texts(64, seed=1)
    engine = make_engine(minilm, embed_cfg(engine={"max_batch_tokens": 2048}))
    ours = embed_all(engine, minilm.tokenizer, texts)
    st = SentenceTransformer(minilm.weights_dir, device="cpu")
    ref = st.encode(texts, batch_size=16, convert_to_tensor=True)
    assert cosine_distance(ours, ref).max().item() < MAX_COSINE_DISTANCE


def st_with_dense(minilm, folder, layers) -> str:
    """all-MiniLM with Dense modules appended by sentence-transformers itself (saved as it saves
    them): LaBSE's and distiluse's kind of head. `layers`: (out_features, activation) each."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize

    torch.manual_seed(0)
    st = SentenceTransformer(minilm.weights_dir, device="cpu")
    width = 384
    for out, act in layers:
        st.append(Dense(width, out, activation_function=act) if out else Normalize())
        width = out or width
    st.save(str(folder))
    return str(folder)


@pytest.mark.parametrize(
    "layers",
    [
        [(96, torch.nn.Tanh())],  # after the model's Normalize (modules: Pooling, Normalize, Dense)
        [(200, torch.nn.GELU()), (0, None), (64, torch.nn.Identity()), (0, None)],
    ],
)
def test_a_sentence_transformers_head_of_dense_layers_equals_encode(minilm, tmp_path, layers):
    """A model whose modules.json ends in Dense layers (and Normalize between them): our vectors
    are sentence-transformers' encode, of the last Dense's width, not the pooled hidden state."""
    from sentence_transformers import SentenceTransformer

    from jobrunner.engine.embed.st_files import vector_width

    where = st_with_dense(minilm, tmp_path / "st", layers)
    loaded = load_model(ModelConfig(source=where, dtype="float32"))
    engine = make_engine(loaded, embed_cfg(model={"source": where}))
    texts = mixed_texts(24, seed=3)
    ours = embed_all(engine, loaded.tokenizer, texts)
    width = [out for out, _ in layers if out][-1]
    assert ours.shape == (24, width) and engine.width == vector_width(where) == width
    ref = SentenceTransformer(where, device="cpu").encode(texts, convert_to_tensor=True)
    assert cosine_distance(ours, ref).max().item() < MAX_COSINE_DISTANCE


def test_a_sentence_transformers_module_jobrunner_does_not_run_is_refused(minilm, tmp_path):
    import json
    import shutil

    where = tmp_path / "st"
    shutil.copytree(minilm.weights_dir, where)
    modules = json.loads((where / "modules.json").read_text())
    modules.append(
        {"idx": 9, "name": "9", "path": "9_LSTM", "type": "sentence_transformers.models.LSTM"}
    )
    (where / "modules.json").write_text(json.dumps(modules))
    loaded = load_model(ModelConfig(source=str(where), dtype="float32"))
    with pytest.raises(ConfigError, match="module 'sentence_transformers.models.LSTM' .* not run"):
        make_engine(loaded, embed_cfg(model={"source": str(where)}))


def test_decoder_last_token_equals_hf_through_the_paged_prefill():
    """SmolLM2 (a decoder): the paged model's prefill, last-token pooling, against HF's
    LlamaModel on each text alone."""
    from transformers import AutoModel

    loaded = load_model(ModelConfig(dtype="float32"))
    cfg = embed_cfg(model={"source": "smollm2-135m-instruct"}, engine={"max_batch_tokens": 256})
    engine = make_engine(loaded, cfg)
    assert engine.pooling == "last" and "PagedPrefill" in engine.stats.notes[0]
    texts = mixed_texts(12, seed=2)
    ours = embed_all(engine, loaded.tokenizer, texts)
    hf = AutoModel.from_pretrained(loaded.weights_dir, dtype=torch.float32)
    refs = []
    with torch.inference_mode():
        for t in texts:
            ids = torch.tensor([loaded.tokenizer(t)["input_ids"]])
            refs.append(F.normalize(hf(input_ids=ids).last_hidden_state[0, -1], dim=0))
    assert cosine_distance(ours, torch.stack(refs)).max().item() < MAX_COSINE_DISTANCE


# ------------------------------------------------------------------ pooling and vectors


def test_pooling_is_read_from_the_sentence_transformers_files(minilm, tmp_path):
    assert st_pooling(minilm.weights_dir) == "mean"
    assert st_max_seq_length(minilm.weights_dir) == 256
    assert pooling_mode("cls", minilm.weights_dir, decoder=False) == "cls"  # the key wins
    assert st_pooling(str(tmp_path)) is None  # no files
    assert pooling_mode("auto", str(tmp_path), decoder=True) == "last"
    assert pooling_mode("auto", str(tmp_path), decoder=False) == "mean"
    (tmp_path / "modules.json").write_text('[{"path": "1_P", "type": "x.models.Pooling"}]')
    (tmp_path / "1_P").mkdir()
    (tmp_path / "1_P" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    assert st_pooling(str(tmp_path)) == "cls"
    # sentence-transformers 5+ saves one pooling_mode instead of a flag per mode
    (tmp_path / "1_P" / "config.json").write_text('{"pooling_mode": "lasttoken"}')
    assert st_pooling(str(tmp_path)) == "last"
    (tmp_path / "1_P" / "config.json").write_text('{"pooling_mode": ["max"]}')
    with pytest.raises(ConfigError, match="pools with max"):
        st_pooling(str(tmp_path))


def test_pool_modes_on_packed_states():
    h = torch.arange(12, dtype=torch.float32).view(6, 2)  # rows: seq a (2), seq b (3), seq c (1)
    lens = [2, 3, 1]
    assert pool(h, lens, "cls").tolist() == [[0, 1], [4, 5], [10, 11]]
    assert pool(h, lens, "last").tolist() == [[2, 3], [8, 9], [10, 11]]
    assert pool(h, lens, "mean").tolist() == [[1, 2], [6, 7], [10, 11]]


def test_dimensions_truncate_then_renormalize():
    v = torch.tensor([3.0, 4.0, 12.0])
    assert finish_vector(v, 2, True) == pytest.approx([0.6, 0.8])
    assert finish_vector(v, None, False) == [3.0, 4.0, 12.0]
    assert finish_vector(v, 2, False) == [3.0, 4.0]


def test_batches_are_length_sorted_under_the_budgets():
    reqs = [Request(str(i), [1] * n, EMBED_SAMPLING) for i, n in enumerate([5, 1, 9, 3, 9, 2])]
    batches = length_batches(reqs, max_tokens=12, max_seqs=3)
    assert [[r.num_prompt_tokens for r in b] for b in batches] == [[1, 2, 3], [5], [9], [9]]
    assert length_runs([2, 2, 3, 5, 5, 5]) == [(0, 2, 2), (4, 1, 3), (7, 3, 5)]


def test_a_cut_input_keeps_its_special_tokens_as_sentence_transformers_does(minilm):
    """input.on_too_long: truncate_right cuts the text, not the tokenizer's closing [SEP]:
    the vector equals sentence-transformers' own truncation at max_seq_length (256)."""
    from sentence_transformers import SentenceTransformer

    from jobrunner.io.readers import RawRow
    from jobrunner.prep.embed import EmbedPreparer
    from jobrunner.types import RowRef

    texts = [" ".join(mixed_texts(12, seed=2)), "a short text"]
    cfg = embed_cfg(input={"prompt": {"column": "text"}, "on_too_long": "truncate_right"})
    prep = EmbedPreparer(cfg, minilm.tokenizer)
    rows = [RawRow({"id": str(i), "text": t}, RowRef("in.jsonl", i)) for i, t in enumerate(texts)]
    reqs = prep.prepare_batch(rows)
    assert len(minilm.tokenizer(texts[0])["input_ids"]) > 256  # the long one is cut
    assert reqs[0].prompt_token_ids[-1] == minilm.tokenizer.sep_token_id
    assert len(reqs[0].prompt_token_ids) == 256
    engine = make_engine(minilm, embed_cfg())
    got = {r.id: r for r in engine.generate(reqs)}
    ours = torch.tensor([got[str(i)].embedding for i in range(len(texts))])
    ref = SentenceTransformer(minilm.weights_dir, device="cpu").encode(
        texts, convert_to_tensor=True
    )
    assert cosine_distance(ours, ref).max().item() < MAX_COSINE_DISTANCE
