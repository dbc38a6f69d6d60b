"""The OpenAI Batch API format: its reader (read.py), preparer (prepare.py), output (output.py);
/v1/embeddings lines (embeddings.py: their preparer in embed jobs, their output bodies).

Shards are JSONL; output.jsonl, errors.jsonl in the Batch API's shape and batch.json are what a
Batch API client reads.
"""

from jobrunner.formats.base import Format
from jobrunner.formats.openai_batch.embeddings import OpenAIEmbedPreparer
from jobrunner.formats.openai_batch.output import BATCH_FILE, OUTPUT_FILE, error_record, finalize
from jobrunner.formats.openai_batch.prepare import OpenAIPreparer
from jobrunner.formats.openai_batch.read import claims, parse_batch_line, read_openai_batch

FORMAT = Format(
    "openai-batch",
    read=read_openai_batch,
    parse_line=parse_batch_line,
    claims=claims,
    compressed=True,
    preparer=OpenAIPreparer,
    embed_preparer=OpenAIEmbedPreparer,
    shards="jsonl",
    error_record=error_record,
    finalize=finalize,
    finalized=(OUTPUT_FILE, BATCH_FILE),
)
