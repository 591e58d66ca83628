"""The flagship's two ways to shape batches (pipelines/embed), end to end and in parts.

Packed rows must write what token-length buckets write: the same parts, the same
embeddings (cosine >= 0.99999), the same dead letters. The end-to-end test runs both on the
same awkward files and compares every output file; the others check the pieces (keys,
results cut by part in the writer), a resume after a failed run, the launch's choice, and
a second real corpus against sentence-transformers, packed.
"""

from __future__ import annotations

import glob
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import beam_jax as bj
from beam_jax import jobs
from beam_jax.testing import assert_conserved
from beam_jax.text import MAX_TOKENIZED_CHARS
from pipelines.embed import job, write
from pipelines.embed import parts as read
from pipelines.embed.embed_parts import EmbedParts
from pipelines.embed.parts import ROW_BITS, Inputs, Part
from tests import flagship as ft

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
MIN_COSINE = 0.9999


def _outputs(out: pathlib.Path) -> tuple[dict[str, pa.Table], dict[str, list[dict]]]:
    """Every embeddings part (by name) and every dead-letter file's lines (by name)."""
    parts = {pathlib.Path(p).name: pq.read_table(p) for p in glob.glob(str(out / "*.parquet"))}
    failed = {}
    for path in glob.glob(str(out / "_failed" / "*.jsonl")):
        lines = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]
        failed[pathlib.Path(path).name] = [
            {k: v for k, v in d.items() if k != "traceback"} for d in lines
        ]
    return parts, failed


def _key(file_index: int, row: int) -> int:
    return file_index << ROW_BITS | row


def _results(keys: list[int]) -> pa.RecordBatch:
    vectors = pa.array(np.repeat(np.array(keys, np.float32), 2), pa.float32())
    output = pa.FixedSizeListArray.from_arrays(vectors, 2)
    return pa.record_batch({"key": pa.array(keys, pa.int64()), "output": output})


def _writer(tmp_path, files: str) -> tuple[write.PartWriter, Inputs]:
    inputs = Inputs("jsonl", tuple(jobs.InputFile(f"/in/{n}.jsonl", 1, 1.0) for n in files))
    schema = pa.schema([("id", pa.int64()), ("embedding", pa.list_(pa.float32()))])
    writer = write.PartWriter(str(tmp_path), inputs, schema)
    writer.setup()
    writer.start_bundle()
    return writer, inputs


def _part(file_index, positions):
    positions = np.array(positions, np.int64)
    return Part(file_index, positions, pa.array(positions + 100 * file_index))


def test_keys_split_back_and_the_writer_cuts_packed_results_by_part(tmp_path):
    keys = [_key(0, 5), _key(0, 6), _key(2, 5), _key(0, 2**39)]
    files, rows = read.split_keys(np.array(keys))
    assert files.tolist() == [0, 0, 2, 0] and rows.tolist() == [5, 6, 5, 2**39]
    writer, inputs = _writer(tmp_path, "ab")
    for part in (_part(0, [0, 1, 2]), _part(0, [3, 4]), _part(1, [0, 2])):
        writer.open(part)
    # the kernel's dead letter, keyed by the row's key; the tokenizer's, by file and row
    kernel = bj.FailedElement.from_error("E", "bad", stage="kernel", element="x", key=_key(1, 2))
    tokenizer = bj.FailedElement.from_error(
        "E", "bad", stage="tokenize", element="x", key=4, source="/in/a.jsonl", row=4
    )
    where = (None, None)
    names = [
        # packed batches: rows of three parts, in the order the packer put them
        *writer.add_results(_results([_key(0, 3), _key(1, 0), _key(0, 1)]), where),
        *writer.add_results(_results([_key(0, 0), _key(0, 2)]), where),
        *writer.add_kernel_dead(kernel, where),
        *writer.add_dead(tokenizer, where),
        *writer.finish_bundle(),
    ]

    sources = [inputs.source(i) for i in range(2)]
    assert sorted(n for n, _, _ in names) == sorted(
        [
            write.embeddings_name(sources[0], 0, 3),
            write.embeddings_name(sources[0], 3, 5),
            write.embeddings_name(sources[1], 0, 3),
        ]
    )
    assert sorted((r, d) for _, r, d in names) == [(1, 1), (1, 1), (3, 0)]
    first = pq.read_table(tmp_path / write.embeddings_name(sources[0], 0, 3))
    assert first.column("id").to_pylist() == [0, 1, 2]  # in row order, with the part's ids
    assert [v[0] for v in first.column("embedding").to_pylist()] == [
        float(_key(0, r)) for r in (0, 1, 2)
    ]
    other = pq.read_table(tmp_path / write.embeddings_name(sources[1], 0, 3))
    assert other.column("id").to_pylist() == [100]
    lines = (tmp_path / write.failed_name(sources[1], 0, 3)).read_text().splitlines()
    # the kernel's dead letter is written with the row's id, file and row
    assert [(d["id"], d["file"], d["row"]) for d in map(ft._where, map(json.loads, lines))] == [
        (102, "/in/b.jsonl", 2)
    ]


def test_a_part_left_open_or_a_row_of_no_open_part_is_an_error(tmp_path):
    writer, _ = _writer(tmp_path, "a")
    writer.open(_part(0, [0, 1, 2]))
    assert list(writer.add_results(_results([_key(0, 1)]), (None, None))) == []
    with pytest.raises(RuntimeError, match="1 parts were still incomplete"):
        list(writer.finish_bundle())
    writer.start_bundle()
    with pytest.raises(RuntimeError, match="no open part"):
        list(writer.add_results(_results([_key(0, 1)]), (None, None)))
    stranger = bj.FailedElement.from_error(
        "E", "bad", stage="tokenize", element="x", source="/elsewhere.jsonl", row=0
    )
    with pytest.raises(RuntimeError, match="not of the job's input files"):
        list(writer.add_dead(stranger, (None, None)))


def test_packed_rows_write_what_buckets_write(tmp_path):
    texts = ft.texts(30)
    raw = [t.encode() for t in texts]
    raw[3] = b"caf\xe9 au lait"  # not UTF-8: this batch is checked value by value
    raw[4] = b""  # empty: embedded as [CLS] [SEP]
    raw[5] = b"word" + b" " * (MAX_TOKENIZED_CHARS + 10) + b"word"  # too long to be prose
    raw[6] = b"enormous prose " * (MAX_TOKENIZED_CHARS // 10)  # embedded from its start
    text = pa.array(raw, pa.binary()).view(pa.string())
    ids = pa.array([*range(25), None, *range(26, 30)], pa.int32())
    text = pa.concat_arrays([text.slice(0, 7), pa.array([None], pa.string()), text.slice(8)])
    pq.write_table(pa.table({"id": ids, "text": text}), tmp_path / "a.parquet")
    # A second file whose ids are int64, one beyond int32: the run's type is the first's.
    pq.write_table(
        pa.table({"id": pa.array([40, 2**40, 42], pa.int64()), "text": ["one", "two", "   "]}),
        tmp_path / "b.parquet",
    )
    source = tmp_path / "*.parquet"
    # Parts cut the reader's batches; float32 matmuls, as the vectors are compared to 1e-5
    # (with bfloat16, packed rows and buckets round otherwise by up to about 1e-3).
    flags = ("--rows_per_part", "4", "--matmuls", "float32")

    packed = ft.run(source, tmp_path / "packed", *flags, "--batching", "packed")
    buckets = ft.run(source, tmp_path / "buckets", *flags, "--batching", "buckets")

    assert (packed.batching, buckets.batching) == ("packed", "buckets")
    parts, failed = _outputs(tmp_path / "packed")
    want_parts, want_failed = _outputs(tmp_path / "buckets")
    assert sorted(parts) == sorted(want_parts) and len(parts) == 8 + 1
    for name, table in parts.items():
        want = want_parts[name]
        assert table.schema == want.schema and table.column("id") == want.column("id"), name
        got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
        expected = np.stack(want.column("embedding").to_numpy(zero_copy_only=False))
        np.testing.assert_allclose(got, expected, atol=1e-5)
        cos = np.sum(got * expected, 1) / (
            np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
        )
        assert cos.min() >= 0.99999, (name, cos.min())
    assert failed == want_failed
    stages = sorted(
        ((d["key"], d["row"], d["stage"]) for f in failed.values() for d in f), key=repr
    )
    expected = [
        *((3, 3, "validation"), (5, 5, "tokenize"), (7, 7, "validation")),
        *((None, 25, "validation"), (2**40, 1, "validation")),
    ]
    assert stages == sorted(expected, key=repr)
    for summary in (packed, buckets):
        assert (summary.rows, summary.results, summary.dead_letters) == (33, 28, 5)
        stages = {k: n for k, n in summary.dead_letters_by_stage.items() if n}
        assert stages == {"validation": 4, "tokenize": 1}
        assert_conserved(summary.totals())
        assert_conserved(summary.kernel)


class FailAfterParts(EmbedParts):
    """Fails the job right after writing its second part, the first time only."""

    failed = False

    def _names(self, written):
        for name in super()._names(written):  # the part is written
            yield name
            type(self).written = getattr(type(self), "written", 0) + 1
            if type(self).written >= 2 and not FailAfterParts.failed:
                FailAfterParts.failed = True
                raise RuntimeError("a worker fault after two parts")


def test_a_run_resumes_after_a_failure(tmp_path, monkeypatch):
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(12)), "text": ft.texts(12)}), source)
    out, flags = tmp_path / "out", ("--rows_per_part", "2")  # 6 parts
    monkeypatch.setattr(job, "EmbedParts", FailAfterParts)

    with pytest.raises(Exception, match="a worker fault after two parts"):
        ft.run(source, out, *flags)
    summary = ft.run(source, out, *flags)

    table, failed = ft.read_outputs(out)
    assert sorted(ft.ids(table)) == list(range(12)) and not failed
    # Parts are written up to two behind in the background: the third and the fourth may
    # have been written before the fault stopped the first run, the fifth not.
    reused = summary.parts_reused
    assert reused in (2, 3, 4) and summary.parts_written == 6 - reused
    # The reused parts' rows are not read again.
    assert summary.rows == summary.results == 2 * (6 - reused)


def test_second_corpus_matches_sentence_transformers(tmp_path):
    meta = json.loads((FIXTURES / "minilm_reference_topics.json").read_text(encoding="utf-8"))
    with np.load(FIXTURES / "minilm_reference_topics.npz", allow_pickle=False) as npz:
        embeddings, full_lengths = npz["embeddings"], npz["full_lengths"]
    texts = meta["texts"]
    assert len(texts) >= 100 and (full_lengths > 256).sum() >= 10
    source = tmp_path / "topics.parquet"
    pq.write_table(pa.table({"id": [f"t{i}" for i in range(len(texts))], "text": texts}), source)
    # Packed: the model's answer does not depend on the rows a text shares.
    flags = ["--batching", "packed"]

    summary = ft.run(source, tmp_path / "out", *flags)

    table, failed = ft.read_outputs(tmp_path / "out")
    assert not failed and summary.results == len(texts) and summary.batching == "packed"
    order = np.argsort([int(i[1:]) for i in ft.ids(table)])
    got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))[order]
    cos = np.sum(got * embeddings, 1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(embeddings, axis=1)
    )
    worst = int(np.argmin(cos))
    assert cos[worst] >= MIN_COSINE, (cos[worst], texts[worst][:80])


def test_packed_parts_are_written_as_the_job_goes(tmp_path, monkeypatch):
    # What a part's pack holds back in a partly filled batch goes in the next part's full
    # batches first: each part is written a few parts after it was tokenized (its tokens
    # emitted two parts on, one pack, its write two parts on), not when the bundle ends.
    from beam_jax.internal import Worker
    from beam_jax.text import TokenizeBatches, builtin_corpus

    rows, parts = 128, 8
    texts = [t for _, t in builtin_corpus(rows * parts)]  # varied lengths: partial batches
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), source)
    events = []
    tokens, written_ = TokenizeBatches._tokens, write.PartWriter._part_written

    def tokens_out(self, batch, *args):
        events.append(("tokenized", int(read.split_keys(batch.column("key").to_numpy())[1][0])))
        yield from tokens(self, batch, *args)

    def part_written(self, written):
        events.append(("written", int(written[0].split("-")[-2])))
        yield from written_(self, written)

    monkeypatch.setattr(TokenizeBatches, "_tokens", tokens_out)
    monkeypatch.setattr(write.PartWriter, "_part_written", part_written)
    # Batches run at once, a shape compiling in the batch that first needs it (no batch
    # waits for the background compiles): the order of events does not depend on timing.
    monkeypatch.setattr(Worker, "ready", lambda self, bucket, n: True)
    flags = ("--rows_per_part", str(rows), "--batching", "packed")
    summary = ft.run(source, tmp_path / "out", *flags, "--max_tokens_per_batch", "2048")
    assert summary.results == len(texts) and summary.batching == "packed"
    starts = list(range(0, rows * parts, rows))
    assert [start for kind, start in events if kind == "tokenized"] == starts
    for at, (kind, start) in enumerate(events):
        if kind == "tokenized":  # the parts six or more before it are written
            done = {s for k, s in events[:at] if k == "written"}
            assert set(range(0, start - rows * 5, rows)) <= done, (start, sorted(done))
