"""ReadArrowBatches over bad files: a file's fault names the file and never sinks the job."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given
from hypothesis import strategies as st

import beam_jax as bj
from beam_jax import jobs
from beam_jax._src.arrow.origin import carry_origin, file_rows, row_origin
from beam_jax._src.arrow.read_files import ReadRowGroup
from beam_jax.internal import origin_of, with_origin
from tests.beam_helpers import pipeline, run


def _write(path, ids, *, row_group_size=4, column="x"):
    table = pa.table({"id": pa.array(ids), column: pa.array([[float(i)] * 3 for i in ids])})
    pq.write_table(table, path, row_group_size=row_group_size)


@pytest.fixture
def files(tmp_path):
    _write(tmp_path / "a.parquet", list(range(0, 10)))
    _write(tmp_path / "b.parquet", list(range(10, 20)))
    good = (tmp_path / "a.parquet").read_bytes()
    (tmp_path / "c_truncated.parquet").write_bytes(good[: len(good) // 2])
    (tmp_path / "d_not_parquet.parquet").write_text("id,x\n1,2\n")
    (tmp_path / "e_empty.parquet").write_bytes(b"")
    _write(tmp_path / "f_other_columns.parquet", [99], column="y")
    return tmp_path


def _ids(batch):
    return batch.column("id").to_pylist()


@pytest.mark.parametrize("spread", [True, False])
def test_bad_files_become_dead_letters_naming_them_and_good_rows_are_all_read(files, spread):
    p = pipeline()
    batches, dead = (
        p
        | bj.ReadArrowBatches(
            str(files / "*.parquet"), columns=["id", "x"], max_rows=3, spread=spread
        ).with_exception_handling()
    )
    assert_that(batches | "Ids" >> bj_flat_ids(), equal_to(list(range(20))))
    assert_that(
        dead | "Files" >> _map(lambda r: (r.source.rsplit("/", 1)[-1], r.stage)),
        equal_to(
            [
                ("c_truncated.parquet", "read"),
                ("d_not_parquet.parquet", "read"),
                ("e_empty.parquet", "read"),
                ("f_other_columns.parquet", "read"),
            ]
        ),
        label="Dead",
    )

    def check_messages(records):
        by_file = {r.source.rsplit("/", 1)[-1]: r.message for r in records}
        assert "has no column(s) ['x']" in by_file["f_other_columns.parquet"]
        for name, message in by_file.items():
            assert name in message, message

    assert_that(dead, check_messages, label="Messages")
    # Without spreading (one worker runs it all) the read has no shuffle of its own.
    labels = [t.unique_name for t in p.to_runner_api().components.transforms.values()]
    read = [name for name in labels if name.startswith("ReadArrowBatches")]
    assert any(name.endswith("GroupByKey") for name in read) == spread, read  # a shuffle
    run(p)


def test_without_exception_handling_the_job_fails_naming_the_file(files):
    p = pipeline()
    _ = p | bj.ReadArrowBatches(str(files / "[ac]*.parquet"))
    with pytest.raises(Exception, match="c_truncated.parquet"):
        run(p)


def test_an_empty_glob_fails_the_launch_naming_the_pattern(tmp_path):
    p = pipeline()
    with pytest.raises(bj.InputFileError, match="no files match .*nothing-here"):
        _ = p | bj.ReadArrowBatches(str(tmp_path / "nothing-here" / "*.parquet"))


def test_a_file_named_like_a_glob_that_matches_nothing_is_that_file(tmp_path):
    path = tmp_path / "rows [v1].parquet"
    pq.write_table(pa.table({"id": [1, 2], "x": [[1.0], [2.0]]}), path)
    assert bj.ReadArrowBatches(str(path)).files() == [str(path)]
    assert jobs.match_inputs(str(path))[0].path == str(path)
    (tmp_path / "rows v.parquet").write_bytes(b"")  # what the glob matches wins
    assert bj.ReadArrowBatches(str(path)).files() == [str(tmp_path / "rows v.parquet")]


def test_a_relative_glob_without_a_directory_matches_the_current_one(tmp_path, monkeypatch):
    for name in ("a.parquet", "b.parquet"):
        pq.write_table(pa.table({"id": [1], "x": [[1.0]]}), tmp_path / name)
    monkeypatch.chdir(tmp_path)
    assert bj.ReadArrowBatches("*.parquet").files() == ["a.parquet", "b.parquet"]
    assert [f.path for f in jobs.match_inputs("b*.parquet")] == ["b.parquet"]


def test_an_unreadable_row_group_is_one_dead_letter(files):
    reader = ReadRowGroup(["id", "x"], None, handle_errors=True)
    out = list(reader.process((str(files / "a.parquet"), 7, 4)))
    assert len(out) == 1 and out[0].tag == bj.DEAD_LETTERS
    record = out[0].value
    assert record.stage == bj.Stage.READ and "row group 7 (4 rows)" in record.message
    good = list(reader.process((str(files / "a.parquet"), 1, 4)))
    assert [b.column("id").to_pylist() for b in good] == [[4, 5, 6, 7]]
    assert np.array_equal(good[0].column("x").to_pylist()[0], [4.0] * 3)


def bj_flat_ids():
    import apache_beam as beam

    return beam.FlatMap(_ids)


def _map(fn):
    import apache_beam as beam

    return beam.Map(fn)


def test_a_file_with_other_types_dead_letters_its_rows_naming_the_file(tmp_path):
    _write(tmp_path / "a.parquet", list(range(6)))
    other = pa.table({"id": pa.array([100, 101]), "x": pa.array([["a"] * 3, ["b"] * 3])})
    pq.write_table(other, tmp_path / "b_strings.parquet")
    p = pipeline()
    results, dead = (
        p
        | bj.ReadArrowBatches(str(tmp_path / "*.parquet"), columns=["id", "x"])
        | bj.RunKernelOnArrow(
            lambda params, element, lengths: element["x"].sum(),
            spec={"x": bj.ArraySpec(("L",), np.float32)},
            columns=bj.ArrowColumns(id="id"),
            bucketing=bj.Bucketing(boundaries={"L": (4,)}, batch_size=4),
        ).with_exception_handling()
    )
    assert_that(results | "Ids" >> bj_flat_ids(), equal_to(list(range(6))))

    def check(records):
        assert sorted(r.key for r in records) == [100, 101]
        for r in records:
            assert "b_strings.parquet (row group 0)" in r.element, r
            assert "list<element: string>" in r.message or "string" in r.message, r

    assert_that(dead, check, label="Dead")
    run(p)


def test_row_groups_are_read_one_ahead_and_emitted_in_their_own_window(files):
    """Within a bundle each row group is read while the previous one's batches go
    downstream: every batch comes out once, in order, in its own element's window and
    timestamp, an unreadable row group as its dead letter in its place, the last at the
    bundle's end."""
    from apache_beam.transforms.window import IntervalWindow
    from apache_beam.utils.windowed_value import WindowedValue

    reader = ReadRowGroup(["id", "x"], 3, handle_errors=True)
    reader.setup()
    reader.start_bundle()
    path = str(files / "a.parquet")
    items = [(path, 0, 4), (path, 7, 4), (path, 1, 4), (path, 2, 2)]
    windows = [IntervalWindow(10 * i, 10 * i + 10) for i in range(len(items))]
    out = []
    for i, (item, window) in enumerate(zip(items, windows, strict=True)):
        emitted = list(reader.process(item, window=window, timestamp=10 * i + 1))
        assert len(emitted) == (0 if i == 0 else {1: 2, 2: 1, 3: 2}[i])  # the previous one
        out += emitted
    out += list(reader.finish_bundle())
    reader.teardown()

    def unwrap(value):
        tag = getattr(value, "tag", None)
        value = value.value if tag else value
        assert isinstance(value, WindowedValue)
        return tag, value

    got = [unwrap(v) for v in out]
    assert [(tag, v.windows[0]) for tag, v in got] == [
        (None, windows[0]),
        (None, windows[0]),
        (bj.DEAD_LETTERS, windows[1]),
        (None, windows[2]),
        (None, windows[2]),
        (None, windows[3]),
    ]
    assert [v.timestamp.micros // 1_000_000 for _, v in got] == [1, 1, 11, 21, 21, 31]
    batches = [v.value for tag, v in got if tag is None]
    assert [_ids(b) for b in batches] == [[0, 1, 2], [3], [4, 5, 6], [7], [8, 9]]
    assert "row group 7 (4 rows)" in got[2][1].value.message


def test_a_reader_keeps_footers_but_reads_a_rewritten_file_with_its_new_one(tmp_path):
    """A worker parses each local file's footer once; a file rewritten since (other size or
    time) is read with its new footer, and each batch says its first file row."""
    path = tmp_path / "a.parquet"
    _write(path, list(range(8)), row_group_size=4)
    reader = ReadRowGroup(["id", "x"], None, handle_errors=False)
    (batch,) = reader.process((str(path), 1, 4))
    assert _ids(batch) == [4, 5, 6, 7] and origin_of(batch) == (str(path), 4)
    (again,) = reader.process((str(path), 0, 4))
    assert _ids(again) == [0, 1, 2, 3] and len(reader._footers) == 1
    _write(path, list(range(100, 109)), row_group_size=3)
    (batch,) = reader.process((str(path), 2, 3))
    assert _ids(batch) == [106, 107, 108] and origin_of(batch) == (str(path), 6)
    assert batch.column("x").to_pylist()[0] == [106.0] * 3


def test_a_compressed_parquet_file_is_one_dead_letter_naming_it(tmp_path):
    """Parquet compresses inside the file; a gzipped file is not Parquet, and says so."""
    import gzip

    _write(tmp_path / "a.parquet", list(range(6)), row_group_size=3)
    packed = tmp_path / "a.parquet.gz"
    packed.write_bytes(gzip.compress((tmp_path / "a.parquet").read_bytes()))
    reader = ReadRowGroup(["id"], None, handle_errors=True)
    (out,) = reader.process((str(packed), 1, 3))
    assert out.tag == bj.DEAD_LETTERS and out.value.source == str(packed)
    assert "of Parquet file" in out.value.message and "a.parquet.gz" in out.value.message


def test_small_row_groups_are_read_together_up_to_max_rows(tmp_path):
    """A file written in small row groups gives batches of up to ``max_rows`` rows that span
    row groups, each with its first file row, every row once; a row group larger than
    ``max_rows`` is still cut into batches of its own."""
    import apache_beam as beam

    _write(tmp_path / "a.parquet", list(range(31)), row_group_size=3)  # 10 x 3, then 1
    _write(tmp_path / "b.parquet", list(range(100, 120)), row_group_size=10)  # 2 x 10
    p = pipeline()
    batches = p | bj.ReadArrowBatches(str(tmp_path / "*.parquet"), columns=["id", "x"], max_rows=8)
    got = batches | beam.Map(
        lambda b: (origin_of(b)[0].rsplit("/", 1)[-1], origin_of(b)[1], _ids(b))
    )
    # a.parquet: row groups 0-1, 2-3, ..., 8-9 (6 rows each), then 10 (1 row) with 8-9:
    # 8-10 (7 rows); b.parquet: each row group of 10 cut into 8 + 2.
    expected = [("a.parquet", 6 * i, list(range(6 * i, 6 * i + 6))) for i in range(4)]
    expected += [("a.parquet", 24, list(range(24, 31)))]
    expected += [("b.parquet", 0, list(range(100, 108))), ("b.parquet", 8, [108, 109])]
    expected += [("b.parquet", 10, list(range(110, 118))), ("b.parquet", 18, [118, 119])]
    assert_that(got, equal_to(expected))
    run(p)


def test_row_groups_read_together_dead_letter_only_the_one_that_cannot_be_read(files):
    """Row groups read together whose read fails are read one by one: the good ones' rows
    come out, batched per row group, and the bad one is one dead letter naming it."""
    reader = ReadRowGroup(["id", "x"], 8, handle_errors=True)
    path = str(files / "a.parquet")  # row groups of 4, 4 and 2 rows
    out = list(reader.process((path, (0, 1, 7), 12)))
    dead = [o.value for o in out if getattr(o, "tag", None) == bj.DEAD_LETTERS]
    batches = [o for o in out if getattr(o, "tag", None) is None]
    assert [_ids(b) for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [origin_of(b)[1] for b in batches] == [0, 4]
    assert len(dead) == 1 and "cannot read row group 7 of Parquet" in dead[0].message
    assert dead[0].source == path
    together = list(reader.process((path, (0, 1, 2), 10)))
    assert [_ids(b) for b in together] == [list(range(8)), [8, 9]]
    assert [origin_of(b)[1] for b in together] == [0, 8]
    assert "(row groups 0-2)" in together[0].schema.metadata[b"beam_jax.source"].decode()


@given(
    counts=st.lists(st.integers(0, 20), max_size=30),
    max_rows=st.one_of(st.none(), st.integers(1, 40)),
)
def test_runs_of_row_groups_cover_each_once_in_order_and_fill_greedily(counts, max_rows):
    from beam_jax._src.arrow.read_files import row_group_runs

    runs = row_group_runs(counts, max_rows)
    assert [g for r in runs for g in r] == list(range(len(counts)))
    for i, r in enumerate(runs):
        assert r == list(range(r[0], r[0] + len(r)))
        total = sum(counts[g] for g in r)
        if max_rows is None:
            assert len(r) == 1
            continue
        assert len(r) == 1 or total <= max_rows
        if i + 1 < len(runs):  # the next row group did not fit
            assert total + counts[runs[i + 1][0]] > max_rows or total > max_rows


def test_a_batch_made_of_some_rows_of_another_says_each_rows_file_row():
    """``carry_origin``: all rows in order keep the first row (metadata only); a subset
    carries a column of file rows, which a subset of it narrows again."""
    batch = with_origin(pa.record_batch({"id": [10, 11, 12, 13]}), "in.parquet", 20)
    whole = carry_origin(pa.record_batch({"k": [10, 11, 12, 13]}), batch)
    assert whole.schema.names == ["k"] and row_origin(whole) == ("in.parquet", 20)
    some = carry_origin(pa.record_batch({"k": [11, 13]}), batch, np.array([1, 3]))
    path, at = row_origin(some)
    assert (path, at.tolist(), origin_of(some)) == ("in.parquet", [21, 23], ("in.parquet", None))
    fewer = carry_origin(some.slice(1), some, np.array([1]))
    assert file_rows(row_origin(fewer)[1], 0) == 23 and file_rows(20, np.arange(2)).tolist() == [
        20,
        21,
    ]
    plain = pa.record_batch({"k": [1]})
    assert carry_origin(plain, pa.record_batch({"id": [1]}), np.array([0])) is plain
