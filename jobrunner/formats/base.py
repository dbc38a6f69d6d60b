"""What a data format is: a reader (input), a preparer (rows -> Requests), a writer (shards).

A format fills in the roles it has; `formats/__init__.py` registers every built-in one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobrunner.io.readers import Item, ReadOptions
from jobrunner.types import RowError, RowRef

if TYPE_CHECKING:
    from jobrunner.prep.prepare import Preparer

# (file, batch_rows, the job's ReadOptions) -> its rows, in order; a reader takes the options
# of its format (CSV: the delimiter) and leaves the others
Reader = Callable[[str, int, ReadOptions], Iterator[Item]]
Writer = Callable[..., None]  # (records, path[, schema]): one shard file


@dataclass(frozen=True)
class Format:
    name: str
    # input
    suffixes: tuple[str, ...] = ()  # files `input.format: auto` reads as this format
    read: Reader | None = None
    # line formats: parses one non-blank line, so a Ray block can be a span of lines (lines.py)
    parse_line: Callable[[bytes, RowRef], Item] | None = None
    claims: Callable[[str, str], bool] | None = None  # (file, its suffix's format): auto picks us
    compressed: bool = False  # a stream of text: read from `x.gz`, `x.zst`... (io/compressed.py)
    # (file, options) -> the Arrow schema of its rows' columns, as the reader gives them
    # (run_schema.py)
    schema: Callable[[str, ReadOptions], Any] | None = None
    # `schema` types every row the reader gives (JSONL): a pass that reads them anyway (the
    # input scan) types them as it goes (formats/columns.SchemaInference), not a second read
    schema_of_rows: bool = False
    preparer: type[Preparer] | None = None  # None: the column/template Preparer
    embed_preparer: type[Preparer] | None = None  # task: embed (None: prep.embed.EmbedPreparer)
    # output
    write: Writer | None = None  # writes one result shard
    suffix: str = ""  # of the shard files `write` makes
    typed: bool = False  # `write` takes the run's schema: write(records, path, schema)
    shards: str | None = None  # the format its shards are written in (None: this one)
    error_record: Callable[[RowError], dict[str, Any]] | None = None  # None: RowError.to_json
    # (rundir, manifest, cfg): files assembled from the committed shards before _SUCCESS
    finalize: Callable[[Any, Any, Any], None] | None = None
    finalized: tuple[str, ...] = ()  # the files `finalize` writes: a rerun remakes missing ones

    @property
    def shard_format(self) -> str:
        return self.shards or self.name

    def writer(self, schema: Any = None) -> Callable[[list[dict[str, Any]], Path], None]:
        """`write` as (records, path), given the run's schema where it takes one."""
        if not self.typed or schema is None:
            return self.write
        return lambda records, path: self.write(records, path, schema)

    @property
    def writable(self) -> bool:
        return self.write is not None or self.shards is not None
