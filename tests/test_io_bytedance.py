"""ByteDance what-if traces: malformed traces and metas, and traces and metas that disagree,
are refused with one SchemaError naming file, column (or key), row (or line), value and what
was expected; nothing clearly broken is read silently; auto-detection recognises a what-if
trace missing a column or named in upper case.

The traces are small synthetic ones built here (2 DP ranks x 2 stages, 2 steps); the real
artifact is used when ../shared/realdata is present.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from holmes_ml.io import SchemaError, detect_format, read_ops
from holmes_ml.io.bytedance import is_whatif_columns, looks_like_bytedance, read_bytedance

REAL = Path(__file__).resolve().parents[1] / ".." / "shared" / "realdata" / "bytedance-whatif"
if not REAL.exists():
    REAL = Path("/work/shared/realdata/bytedance-whatif")

DP, PP = 2, 2
META = "trial_name: T\nrun_id: 0\ndp_size: 2\ndsp_size: 1\npp_size: 2\ntp_size: 1\n" \
       "vpp_size: 1\nworld_size: 4\n"


def _trace(tp: int = 1) -> pd.DataFrame:
    """A well-formed what-if trace: 2 steps of 2 micro-batches on DP x PP workers whose
    recorded (TP rank 0) rank is ``(stage * DP + dp) * tp``."""
    rows = []
    for step in (10, 11):
        for d in range(DP):
            for s in range(PP):
                ops: list[str] = []
                for _ in range(2):
                    ops += ["forward-recv"] * (s > 0) + ["forward-compute"] \
                        + ["forward-send"] * (s < PP - 1)
                for _ in range(2):
                    ops += ["backward-recv"] * (s < PP - 1) + ["backward-compute"] \
                        + ["backward-send"] * (s > 0)
                ops += ["grads-reduce-scatter"] + ["embedding-grads-all-reduce"] \
                    * (s in (0, PP - 1)) + ["layernorm-grads-all-reduce", "optimizer",
                                            "params-all-gather", "gc"]
                rows += [dict(dp_rank=d, stage=s, rank=(s * DP + d) * tp, step=step, optype=o,
                              start_ts=0.01 * k, duration=0.005, seq_id=k, mc=0, mb_id=0,
                              gmc=0) for k, o in enumerate(ops)]
    df = pd.DataFrame(rows)
    return df.astype({"dp_rank": np.int8, "stage": np.int8, "rank": np.int16,
                      "start_ts": np.float32, "duration": np.float32, "seq_id": np.int32,
                      "optype": "category"})


def _write(tmp: Path, df: pd.DataFrame, meta: str | bytes = META,
           name: str = "trace-T.parquet") -> Path:
    p = tmp / name
    df.to_parquet(p)
    m = tmp / "meta-T.yaml"
    if isinstance(meta, bytes):
        m.write_bytes(meta)
    else:
        m.write_text(meta)
    return p


def _set(column: str, value: object, where: Callable[[pd.DataFrame], pd.Series] | None = None,
         dtype: object = None) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """A mutation: ``column`` := ``value`` on the rows ``where`` selects (default row 5)."""
    def mutate(df: pd.DataFrame) -> pd.DataFrame:
        df = df.astype({column: dtype}) if dtype is not None else df.copy()
        mask = where(df) if where is not None else df.index == 5
        df.loc[mask, column] = value
        return df
    return mutate


def _op(name: str, stage: int | None = None) -> Callable[[pd.DataFrame], pd.Series]:
    def where(df: pd.DataFrame) -> pd.Series:
        m = df["optype"].astype(str) == name
        if stage is not None:
            m &= df["stage"] == stage
        return m & (df.index == m.idxmax())  # the first such row
    return where


def _keep(df: pd.DataFrame) -> pd.DataFrame:
    return df


def _meta(old: str, new: str) -> str:
    assert old in META
    return META.replace(old, new)


# id, trace mutation, meta text, regex the message must match. Each case crashed with a
# non-SchemaError, gave a misleading message or was accepted before the checks.
CASES = [
    # trace and meta disagree / values out of range
    ("dp_rank_minus1", _set("dp_rank", -1, lambda d: d["dp_rank"] == 1), META,
     r"trace-T\.parquet, column 'dp_rank', row 28: out of range \(got -1; expected an integer "
     r"in \[0, 1\] \(dp_size 2 in meta-T\.yaml\)\)"),
    ("dp_rank_nan", _set("dp_rank", np.nan, dtype=float), META,
     r"column 'dp_rank', row 5: not an integer \(got nan; expected an integer in \[0, 1\]"),
    ("dp_rank_text", _set("dp_rank", "x", dtype=str), META,
     r"column 'dp_rank', row 5: not an integer \(got 'x'"),
    ("dp_rank_bool", lambda d: d.assign(dp_rank=d["dp_rank"] > 0), META,
     r"column 'dp_rank', row 0: not an integer \(got False"),
    ("stage_minus1_on_reduce_scatter", _set("stage", -1, _op("grads-reduce-scatter")), META,
     r"column 'stage', row 8: out of range \(got -1; expected an integer in \[0, 1\] "
     r"\(pp_size 2 in meta-T\.yaml\)\)"),
    ("stage_99", _set("stage", 99), META, r"column 'stage', row 5: out of range \(got 99;"),
    ("pp_size_smaller_than_stages", _keep, _meta("pp_size: 2", "pp_size: 1")
     .replace("world_size: 4", "world_size: 2"),
     r"column 'stage', row 14: out of range \(got 1; expected an integer in \[0, 0\] "
     r"\(pp_size 1 in meta-T\.yaml\)\)"),
    ("pp_size_99_stage_1_is_a_middle_stage", _keep,
     _meta("pp_size: 2", "pp_size: 99").replace("world_size: 4\n", ""),
     r"column 'stage', row \d+: embedding-grads-all-reduce on a middle pipeline stage \(got 1;"),
    ("rank_float", _set("rank", 1.5, dtype=float), META,
     r"column 'rank', row 5: not an integer \(got 1\.5;"),
    ("rank_beyond_world_size", _set("rank", 2**40, lambda d: d["rank"] == 3, dtype=np.int64),
     META, r"column 'rank', row \d+: out of range \(got 1099511627776; expected an integer in "
     r"\[0, 3\] \(world_size 4 in meta-T\.yaml\)\)"),
    ("step_float", _set("step", -1e-9, dtype=float), META,
     r"column 'step', row 5: not an integer \(got -1e-09; expected an integer >= 0\)"),
    ("seq_id_nan", _set("seq_id", np.nan, dtype=float), META,
     r"column 'seq_id', row 5: not an integer \(got nan"),
    ("start_ts_text", _set("start_ts", "x", dtype=str), META,
     r"column 'start_ts', row 5: not a finite number \(got 'x'; expected a finite number of "
     r"seconds >= 0\)"),
    ("duration_text", _set("duration", "slow", dtype=str), META,
     r"column 'duration', row 5: not a finite number \(got 'slow'"),
    ("duration_inf", _set("duration", np.inf), META,
     r"column 'duration', row 5: not a finite number \(got inf"),
    ("start_ts_negative", _set("start_ts", -2.0), META,
     r"column 'start_ts', row 5: negative time \(got -2\.0"),
    ("start_ts_beyond_int64_ns", _set("start_ts", 1e12, dtype=np.float64), META,
     r"column 'start_ts', row 5: times too large"),
    ("duration_beyond_int64_ns", _set("duration", 1e30, dtype=np.float64), META,
     r"column 'duration', row 5: times too large.* \(got 1e\+30"),
    ("two_ranks_for_one_worker", _set("rank", 2, lambda d: (d["rank"] == 0) & (d["step"] == 11)),
     META, r"column 'rank', row \d+: a second rank for the worker at dp_rank 0, stage 0 \(got 2; "
     r"expected rank 0 as in row 0"),
    ("one_rank_for_two_workers", _set("rank", 0, lambda d: d["rank"] == 1), META,
     r"column 'dp_rank', row 28: rank 0 recorded as a second worker \(got 1; expected dp_rank 0"),
    ("send_from_the_last_stage", _set("optype", "forward-send", _op("forward-compute", stage=1)),
     META, r"column 'optype', row \d+: forward-send on stage 1 needs pipeline stage 2, which "
     r"does not exist"),
    ("tp_group_not_on_tp_rank_0", _keep, _meta("tp_size: 1", "tp_size: 2")
     .replace("world_size: 4", "world_size: 8"),
     r"column 'rank', row \d+: the rank of a layernorm all-reduce is not a TP-rank-0 worker "
     r"\(got 1; expected a multiple of tp_size 2"),
    # meta problems
    ("dp_size_0", _keep, _meta("dp_size: 2", "dp_size: 0"),
     r"meta-T\.yaml, dp_size, line 3: out of range \(got 0; expected an integer in \[1, "),
    ("tp_size_0", _keep, _meta("tp_size: 1", "tp_size: 0"),
     r"meta-T\.yaml, tp_size, line 6: out of range \(got 0;"),
    ("tp_size_minus2", _keep, _meta("tp_size: 1", "tp_size: -2"),
     r"meta-T\.yaml, tp_size, line 6: out of range \(got -2;"),
    ("pp_size_text", _keep, _meta("pp_size: 2", "pp_size: two"),
     r"meta-T\.yaml, pp_size, line 5: not an integer \(got 'two'"),
    ("world_size_mismatch", _keep, _meta("world_size: 4", "world_size: 16"),
     r"meta-T\.yaml, world_size, line 8: not the product of the parallel sizes \(got 16; "
     r"expected dp_size \* pp_size \* tp_size \* dsp_size = 2 \* 2 \* 1 \* 1 = 4\)"),
    ("dp_size_twice", _keep, META + "dp_size: 4\n",
     r"meta-T\.yaml, dp_size, line 9: given twice"),
    ("meta_latin1", _keep, ("# caf\xe9\n" + META).encode("latin-1"),
     r"meta-T\.yaml, line 1: not UTF-8 text \(byte 0xe9"),
    # columns
    ("missing_seq_id", lambda d: d.drop(columns="seq_id"), META,
     r"trace-T\.parquet, column 'seq_id': missing what-if column seq_id \(expected columns"),
    ("missing_dp_rank", lambda d: d.drop(columns="dp_rank"), META,
     r"column 'dp_rank': missing what-if column dp_rank"),
]


@pytest.mark.parametrize("mutate,meta,match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_trace_or_meta_is_refused(tmp_path, mutate, meta, match):
    p = _write(tmp_path, mutate(_trace()), meta)
    with pytest.raises(SchemaError, match=match) as err:
        read_ops(p)  # auto-detected as a what-if trace, then read
    assert "np." not in str(err.value)


def test_synthetic_trace_reads(tmp_path):
    ops = read_ops(_write(tmp_path, _trace()))
    assert sorted(ops["rank"].unique()) == [0, 1, 2, 3]
    assert set(ops["group_kind"]) == {"pp", "dp", "emb"}  # tp_size 1: layernorm dropped
    assert (ops.loc[ops["group"] == "dp-1", "group_ranks"] == "2 3").all()


def test_tp_groups_of_tp_rank_0_workers(tmp_path):
    meta = _meta("tp_size: 1", "tp_size: 2").replace("world_size: 4", "world_size: 8")
    ops = read_ops(_write(tmp_path, _trace(tp=2), meta))
    tp = ops[ops["group_kind"] == "tp"]
    assert set(tp["group_ranks"]) == {"0 1", "2 3", "4 5", "6 7"}


def test_meta_comments_quotes_and_bom_are_read(tmp_path):
    meta = "\ufeff# sizes\n" + META.replace("dp_size: 2", "dp_size: '2'  # two DP ranks")
    ops = read_ops(_write(tmp_path, _trace(), meta.encode("utf-8")))
    assert ops["rank"].nunique() == 4


def test_meta_given_as_a_dict_is_checked(tmp_path):
    p = _write(tmp_path, _trace())
    with pytest.raises(SchemaError, match=r"the meta argument, dp_size: out of range \(got 0;"):
        read_bytedance(p, meta={"dp_size": 0, "pp_size": 2, "tp_size": 1})
    with pytest.raises(SchemaError, match=r"the meta argument, pp_size: missing parallel size"):
        read_bytedance(p, meta={"dp_size": 2, "tp_size": 1})
    ops = read_bytedance(p, meta={"dp_size": 2, "pp_size": 2, "tp_size": 1})
    assert len(ops)


def test_rows_are_data_rows_whatever_index_was_saved(tmp_path):
    df = _set("dp_rank", 7)(_trace())
    df.index = df.index + 1000  # pandas stores a non-default index in the Parquet metadata
    with pytest.raises(SchemaError, match=r"column 'dp_rank', row 5: out of range") as err:
        read_ops(_write(tmp_path, df))
    assert err.value.row == 5


@pytest.mark.parametrize("name", ["trace-T.PARQUET", "trace-T.Parquet", "trace-T.pq"])
def test_detected_whatever_the_suffix_case(tmp_path, name):
    p = _write(tmp_path, _trace(), name=name)
    assert detect_format(p) == "bytedance"
    assert read_ops(p)["rank"].nunique() == 4


def test_trace_missing_a_column_is_still_detected(tmp_path):
    for column in ("seq_id", "duration", "dp_rank", "optype"):
        p = _write(tmp_path, _trace().drop(columns=column))
        assert looks_like_bytedance(p), column
        with pytest.raises(SchemaError, match=f"missing what-if column {column}"):
            read_ops(p)


def test_other_parquet_tables_are_not_taken_for_what_if_traces(tmp_path):
    native = pd.DataFrame({"iteration": [0], "rank": [0], "op": ["all_reduce"],
                           "group": ["dp-0"], "seq": [0], "nbytes": [8], "start_ns": [0],
                           "duration_us": [1.0], "stage": [0], "dp_rank": [0]})
    native.to_parquet(tmp_path / "ops.parquet")
    assert detect_format(tmp_path / "ops.parquet") == "native"
    assert not is_whatif_columns(["rank", "step", "optype", "start_ts", "duration"])
    assert not is_whatif_columns(["dp_rank", "rank", "step", "start_ts", "duration", "seq_id"])
    assert is_whatif_columns(["dp_rank", "stage", "rank", "step", "start_ts", "duration"])


# Real traces ---------------------------------------------------------------------------------

needs_real = pytest.mark.skipif(not REAL.exists(), reason="realdata not available")


@pytest.fixture(scope="module")
def real_st() -> pd.DataFrame:
    df = pd.read_parquet(REAL / "trace-ST.parquet")
    return df[df["step"].isin(sorted(df["step"].unique())[:2])].reset_index(drop=True)


@needs_real
def test_real_trace_upper_case_suffix_reads_like_lower_case(tmp_path, real_st):
    lower = tmp_path / "lower"
    upper = tmp_path / "upper"
    for d in (lower, upper):
        d.mkdir()
        shutil.copy(REAL / "meta-ST.yaml", d / "meta-ST.yaml")
    real_st.to_parquet(lower / "trace-ST.parquet")
    real_st.to_parquet(upper / "trace-ST.PARQUET")
    pd.testing.assert_frame_equal(read_ops(upper / "trace-ST.PARQUET"),
                                  read_ops(lower / "trace-ST.parquet"))


@needs_real
@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.drop(columns="seq_id"), r"column 'seq_id': missing what-if column seq_id"),
    (_set("dp_rank", -1, lambda d: d["dp_rank"] == 1),
     r"column 'dp_rank', row \d+: out of range \(got -1; expected an integer in \[0, 1\] "
     r"\(dp_size 2 in meta-ST\.yaml\)\)"),
], ids=["missing_seq_id", "dp_rank_minus1"])
def test_real_trace_slice_malformed(tmp_path, real_st, mutate, match):
    mutate(real_st).to_parquet(tmp_path / "trace-ST.parquet")
    shutil.copy(REAL / "meta-ST.yaml", tmp_path / "meta-ST.yaml")
    with pytest.raises(SchemaError, match=match):
        read_ops(tmp_path / "trace-ST.parquet")


@needs_real
def test_real_meta_world_size_is_the_product_with_dsp(tmp_path):
    # trace-SE: dp 32 x pp 2 x tp 1 x dsp 2 = world_size 128
    from holmes_ml.io.bytedance import read_meta

    assert read_meta(REAL / "meta-SE.yaml")["world_size"] == 128
    bad = (REAL / "meta-SE.yaml").read_text().replace("dsp_size: 2", "dsp_size: 1")
    (tmp_path / "meta-SE.yaml").write_text(bad)
    with pytest.raises(SchemaError, match=r"world_size, line \d+: not the product.* = 64\)"):
        read_meta(tmp_path / "meta-SE.yaml")


def test_two_traces_in_one_read_are_refused_naming_both(tmp_path):
    # (an agent's --follow directory holding two jobs' traces says the same, naming the dir)
    a = _write(tmp_path, _trace(), name="trace-A.parquet")
    b = _write(tmp_path, _trace(), name="trace-B.parquet")
    with pytest.raises(SchemaError, match=r"trace-A\.parquet, trace-B\.parquet.*job of its own"
                       r".*one trace-\*\.parquet per read"):
        read_ops([a, b])


def test_a_row_written_twice_is_dropped_not_paired(tmp_path, caplog):
    """A repeated send would take the next message's place in its pair's count: every later
    message of the pair would meet the wrong partner. It is dropped, with a warning."""
    df = _trace()
    want = read_ops(_write(tmp_path, df))
    i = int(df.index[df["optype"] == "forward-send"][0])
    twice = pd.concat([df.iloc[:i + 1], df.iloc[[i]], df.iloc[i + 1:]], ignore_index=True)
    with caplog.at_level("WARNING"):
        got = read_ops(_write(tmp_path, twice))
    assert f"dropped 1 row(s) repeating an earlier row exactly (first: row {i + 1})" \
        in caplog.text
    pd.testing.assert_frame_equal(got, want)


def test_forcing_bytedance_on_other_files_says_they_are_no_parquet(tmp_path):
    # a directory of two Kineto JSON traces: "several what-if traces" sent the user astray
    d = tmp_path / "traces"
    d.mkdir()
    for r in (0, 1):
        (d / f"rank{r}.pt.trace.json").write_text('{"traceEvents": []}')
    with pytest.raises(SchemaError, match=r"rank0\.pt\.trace\.json: not Parquet"):
        read_ops(d, format="bytedance")
    # two real what-if traces are still two jobs
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a", "b"):
        _write(two, _trace(), name=f"trace-{name}.parquet")
    with pytest.raises(SchemaError, match="several what-if traces"):
        read_ops(two, format="bytedance")
