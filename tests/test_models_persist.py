"""Model envelope round-trip, tampering and foreign files; default model; score_ops."""

from __future__ import annotations

import json
import zipfile

import joblib
import numpy as np
import pytest
from sklearn.datasets import make_classification

from holmes_ml.models import (
    LightGBMDetector,
    ModelFileError,
    RandomForestDetector,
    default_model,
    load_model,
    read_header,
    save_model,
    score_features,
    score_ops,
)
from holmes_ml.models.persist import _header_sha256
from holmes_ml.models.score import DEFAULT_MODEL


@pytest.fixture()
def fitted():
    X, y = make_classification(200, n_features=5, random_state=0)
    return RandomForestDetector(n_estimators=10, random_state=0).fit(X, y), X, y


def test_round_trip_keeps_scores_and_header(fitted, tmp_path):
    det, X, y = fitted
    path = save_model(det, tmp_path / "m.holmes", metrics={"f1": 0.9}, training_data=(X, y))
    back = load_model(path, check_features=False)  # 5 features of its own
    np.testing.assert_allclose(back.decision_function(X), det.decision_function(X))
    h = read_header(path)
    assert h["metrics"] == {"f1": 0.9}
    assert set(h["versions"]) == {"holmes_ml", "sklearn", "lightgbm", "numpy"}
    assert len(h["training_data_sha256"]) == 64


def test_tampered_payload_is_refused(fitted, tmp_path):
    det, X, y = fitted
    path = save_model(det, tmp_path / "m.holmes")
    other = RandomForestDetector(n_estimators=3, random_state=1).fit(X, y)
    with zipfile.ZipFile(path) as zf:
        header = zf.read("header.json")
    bad = tmp_path / "bad.holmes"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("header.json", header)
        with zf.open("model.joblib", "w") as fh:
            joblib.dump(other, fh)
    with pytest.raises(ModelFileError, match="bad.holmes.*sha256.*modified"):
        load_model(bad)


def test_foreign_files_are_refused(fitted, tmp_path):
    det, _, _ = fitted
    pkl = tmp_path / "plain.pkl"
    joblib.dump(det, pkl)
    with pytest.raises(ModelFileError, match="plain.pkl: not a holmes_ml model envelope"):
        load_model(pkl)
    z = tmp_path / "other.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("header.json", json.dumps({"format": {"name": "something-else"}}))
        zf.writestr("model.joblib", b"x")
    with pytest.raises(ModelFileError, match="other.zip: header format"):
        load_model(z)


def test_version_drift_warns(fitted, tmp_path):
    det, _, _ = fitted
    path = save_model(det, tmp_path / "m.holmes")
    header, payload = _parts(path)
    header["versions"]["sklearn"] = "0.0.1"
    header["header_sha256"] = _header_sha256(header)  # drift, not an edit
    drifted = tmp_path / "drifted.holmes"
    with zipfile.ZipFile(drifted, "w") as zf:
        zf.writestr("header.json", json.dumps(header))
        zf.writestr("model.joblib", payload)
    with pytest.warns(UserWarning, match="sklearn saved 0.0.1"):
        load_model(drifted, check_features=False)


def test_default_model_scores_simulated_ops():
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    res = simulate(SimConfig(gpus=64, iterations=12, seed=11,
                             faults=(FaultSpec.parse("gpu_slow:rank=5,severity=0.8,start=4"),)))
    det = default_model()
    s = score_ops(res.ops)
    assert s.shape == (len(res.ops),) and s.dtype == np.float64
    ab = res.ops["abnormal"].to_numpy(dtype=bool)
    # Abnormal ops must rank well above normal ones, and few normal ops may cross the cut.
    assert np.median(s[ab]) > np.quantile(s[~ab], 0.99)
    assert (s[~ab] >= det.threshold_).mean() < 0.01
    shuffled = res.ops.sample(frac=1.0, random_state=0)
    np.testing.assert_allclose(score_ops(shuffled), s[shuffled.index.to_numpy()], atol=1e-9)
    # a model file's path, as analyze takes it (a str was an AttributeError)
    from importlib import resources

    bundled = resources.files("holmes_ml.data") / DEFAULT_MODEL
    np.testing.assert_allclose(score_ops(res.ops, model=str(bundled)), s, atol=1e-12)
    with pytest.raises(TypeError, match="model: got a int; expected a fitted holmes_ml "
                                        "detector, a model file's path or None"):
        score_ops(res.ops, model=42)
    # features handed in are checked for NaN and infinity by the model's input check; those
    # score_ops builds itself are finite by construction and skip it, scoring the same
    from holmes_ml.features import build_features

    feats = build_features(res.ops)
    np.testing.assert_array_equal(score_ops(res.ops, features=feats), s)
    np.testing.assert_array_equal(score_features(feats, det, finite=True), s)
    feats.iloc[3, feats.columns.get_loc("hist_z")] = np.inf
    with pytest.raises(ValueError, match="Input X contains infinity"):
        score_ops(res.ops, features=feats)


def _parts(path):
    """An envelope's header (as a dict) and payload bytes, to edit and write back."""
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read("header.json")), zf.read("model.joblib")


def _envelope(path, header, payload):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("header.json", json.dumps(header))
        zf.writestr("model.joblib", payload)
    return path


@pytest.mark.parametrize(("what", "said"), [
    ("dict", "holds a dict, not a detector"),
    ("foreign class", "with objects this version cannot load (ModuleNotFoundError"),
    ("versions list", "header field 'versions' is []; expected an object"),
])
def test_an_envelope_whose_payload_is_no_detector_here_is_refused(fitted, tmp_path, what,
                                                                  said):
    """A hash-consistent envelope holding no detector, one of a class this version lacks, or a
    header whose versions are no object: a ModelFileError naming the file, not a traceback."""
    import hashlib
    import io
    import pickle

    det, _, _ = fitted
    path = save_model(det, tmp_path / "m.holmes")
    header = read_header(path)
    if what == "dict":
        buf = io.BytesIO()
        joblib.dump({"a": 1}, buf)
        payload = buf.getvalue()
    elif what == "foreign class":
        # a pickle naming a module this installation does not have
        payload = pickle.dumps(det).replace(b"holmes_ml.models", b"holmes_zz.models")
    else:
        with zipfile.ZipFile(path) as zf:
            payload = zf.read("model.joblib")
        header["versions"] = []
    header["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    header["header_sha256"] = _header_sha256(header)
    bad = _envelope(tmp_path / "bad.holmes", header, payload)
    with pytest.raises(ModelFileError, match=r"bad\.holmes: ") as err:
        load_model(bad)
    assert said in str(err.value)


@pytest.mark.parametrize("edit", ["metrics", "no feature schema", "estimator", "hash dropped"])
def test_an_edited_header_is_refused(fitted, tmp_path, edit):
    """The header is covered by its own hash: a better metric, a schema set to null (which
    skipped the schema check) or another estimator name is an edit, refused as one."""
    det, _, _ = fitted
    path = save_model(det, tmp_path / "m.holmes", metrics={"f1": 0.5},
                      feature_columns=[f"c{i}" for i in range(5)])
    header, payload = _parts(path)
    if edit == "metrics":
        header["metrics"]["f1"] = 0.99
    elif edit == "no feature schema":
        header["feature_columns"] = None
    elif edit == "estimator":
        header["estimator"] = "LightGBMDetector"
    else:
        del header["header_sha256"]
    bad = _envelope(tmp_path / "bad.holmes", header, payload)
    with pytest.raises(ModelFileError, match=r"bad\.holmes: header sha256 .* the file was "
                                             "modified"):
        load_model(bad, check_features=False)
    with pytest.raises(ModelFileError, match="modified"):
        read_header(bad)


def test_a_header_naming_another_estimator_than_its_payload_is_refused(fitted, tmp_path):
    """Even with both hashes made to match, the header's estimator must be the payload's."""
    det, _, _ = fitted
    path = save_model(det, tmp_path / "m.holmes")
    header, payload = _parts(path)
    header["estimator"] = LightGBMDetector.__name__
    header["header_sha256"] = _header_sha256(header)
    bad = _envelope(tmp_path / "bad.holmes", header, payload)
    with pytest.raises(ModelFileError, match=r"bad\.holmes: header names estimator "
                                             "'LightGBMDetector' but the payload holds a "
                                             "RandomForestDetector"):
        load_model(bad)


def test_a_version_1_envelope_without_header_hash_still_loads(fitted, tmp_path):
    """Files written before the header hash load as they are, and upgrade_envelope rewrites
    one in today's format with the same payload bytes (as the bundled model was)."""
    from holmes_ml.models.persist import upgrade_envelope

    det, X, _ = fitted
    path = save_model(det, tmp_path / "m.holmes")
    header, payload = _parts(path)
    assert header["format"]["version"] == 2
    header["format"]["version"] = 1
    del header["header_sha256"]
    old = _envelope(tmp_path / "old.holmes", header, payload)
    np.testing.assert_array_equal(load_model(old, check_features=False).decision_function(X),
                                  det.decision_function(X))
    new = upgrade_envelope(old, tmp_path / "new.holmes")
    up = read_header(new)
    assert up["format"]["version"] == 2 and up["extra"]["upgraded_from_format"] == 1
    assert up["payload_sha256"] == header["payload_sha256"] and _parts(new)[1] == payload
    assert {k: v for k, v in up.items() if k not in ("format", "extra", "header_sha256")} == {
        k: v for k, v in header.items() if k not in ("format", "extra")}
    _, same = _parts(new)
    edited = dict(up, metrics={"f1": 1.0})  # the upgraded header is hashed: an edit shows
    with pytest.raises(ModelFileError, match="header sha256"):
        load_model(_envelope(tmp_path / "edited.holmes", edited, same), check_features=False)
    bundled = read_header(default_model_path())  # today's format, its header hashed
    assert bundled["format"]["version"] == 2 and len(bundled["header_sha256"]) == 64


def default_model_path():
    from importlib import resources

    return resources.files("holmes_ml") / "data" / "default-model.holmes"


def test_an_estimator_of_another_library_is_neither_saved_nor_loaded_nor_scored(fitted,
                                                                                 tmp_path):
    """A LogisticRegression has a decision_function too, but its scores are unbounded margins:
    thresholded as P(abnormal) they would flag at random. save_model, load_model and
    score_ops refuse it, naming what they expected."""
    import hashlib
    import io

    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    from holmes_ml.features import FEATURE_COLUMNS

    _, X, y = fitted
    lr = LogisticRegression().fit(X, y)
    with pytest.raises(TypeError, match="save_model: model is a LogisticRegression, not a "
                                        "detector of holmes_ml .*P\\(abnormal\\) in \\[0, 1\\]"):
        save_model(lr, tmp_path / "lr.holmes")
    assert not (tmp_path / "lr.holmes").exists()
    header = read_header(save_model(fitted[0], tmp_path / "m.holmes"))
    buf = io.BytesIO()
    joblib.dump(lr, buf)
    header.update(estimator="LogisticRegression",
                  payload_sha256=hashlib.sha256(buf.getvalue()).hexdigest())
    header["header_sha256"] = _header_sha256(header)
    bad = _envelope(tmp_path / "bad.holmes", header, buf.getvalue())
    with pytest.raises(ModelFileError, match=r"bad\.holmes: holds a LogisticRegression, not a "
                                             "detector of holmes_ml"):
        load_model(bad, check_features=False)
    F = pd.DataFrame(np.random.default_rng(0).normal(size=(5, len(FEATURE_COLUMNS))),
                     columns=list(FEATURE_COLUMNS))
    margins = LogisticRegression().fit(F, [0, 1, 0, 1, 1])
    with pytest.raises(ValueError, match="score_ops: model LogisticRegression scored ops from "
                                         ".*; expected P\\(abnormal\\) in \\[0, 1\\]"):
        score_ops(pd.DataFrame(index=range(5)), model=margins, features=F)


def test_a_caller_cannot_change_the_default_model_of_later_calls():
    """default_model() is a copy of its own: re-configuring and re-fitting it leaves what later
    calls and score_ops use as it was (it used to be the one cached object)."""
    from holmes_ml.features import FEATURE_COLUMNS, build_features
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    ops = simulate(SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=8, seed=3, faults=(
        FaultSpec.parse("gpu_slow:rank=5,severity=0.8,start=2"),))).ops
    before = score_ops(ops)
    threshold = default_model().threshold_
    mine = default_model()
    assert mine is not default_model()
    X, y = build_features(ops)[list(FEATURE_COLUMNS)], ops["abnormal"].to_numpy(bool)
    mine.set_params(detector=RandomForestDetector(n_estimators=3, random_state=0)).fit(X, y)
    mine.threshold_ = 0.01
    assert default_model().threshold_ == threshold
    assert type(default_model().detector).__name__ == "LightGBMDetector"
    np.testing.assert_array_equal(score_ops(ops), before)


def test_a_model_fitted_on_an_unnamed_array_is_saved_with_a_warning_and_counted_on_load(tmp_path):
    """Its envelope cannot name its features; load_model still refuses a wrong count."""
    from holmes_ml.features import FEATURE_COLUMNS

    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.3
    for n, refused in ((10, True), (len(FEATURE_COLUMNS), False)):
        X = rng.normal(size=(300, n)) + y[:, None]
        det = RandomForestDetector(n_estimators=5, random_state=0).fit(X, y)
        with pytest.warns(UserWarning, match="records no feature schema"):
            path = save_model(det, tmp_path / f"np{n}.holmes")
        assert read_header(path)["feature_columns"] is None
        if refused:
            with pytest.raises(ModelFileError, match=rf"np10.holmes: takes 10 features .* {len(FEATURE_COLUMNS)}"):
                load_model(path)
            assert load_model(path, check_features=False).n_features_in_ == 10
        else:
            assert load_model(path).n_features_in_ == n


@pytest.mark.parametrize(("change", "said"), [
    ("drop", "differs from this holmes_ml's FEATURE_COLUMNS ({n}): it lacks {first}; retrain"),
    ("add", "it has extra_feature, which this version does not build; retrain"),
    ("swap", "it holds the same columns in another order (first apart: {second} where this version "
             "has {first})"),
    ("twice", "it names a column twice; retrain"),
])
def test_a_model_of_another_feature_schema_is_refused_naming_the_columns(
        fitted, tmp_path, change, said):
    from holmes_ml.features import FEATURE_COLUMNS

    det, _, _ = fitted
    cols = list(FEATURE_COLUMNS)
    first, second = cols[0], cols[1]
    cols = {"drop": cols[1:], "add": [*cols, "extra_feature"],
            "swap": [second, first, *cols[2:]], "twice": [*cols, first]}[change]
    path = save_model(det, tmp_path / "m.holmes", feature_columns=cols)
    with pytest.raises(ModelFileError) as err:
        load_model(path)
    said = said.format(first=first, second=second, n=len(FEATURE_COLUMNS))
    assert said in str(err.value), str(err.value)


def test_an_unfitted_detector_is_neither_saved_nor_loaded(fitted, tmp_path):
    """save_model(LightGBMDetector()) wrote an envelope (warning only that no column names
    were seen) that loaded, and `holmes detect --model` then failed with sklearn's 'not
    fitted yet' without naming the file."""
    import hashlib
    import io

    with pytest.raises(TypeError, match="save_model: model is an unfitted LightGBMDetector"):
        save_model(LightGBMDetector(), tmp_path / "unfit.holmes")
    assert not (tmp_path / "unfit.holmes").exists()
    header = read_header(save_model(fitted[0], tmp_path / "m.holmes"))
    buf = io.BytesIO()
    joblib.dump(RandomForestDetector(), buf)
    header.update(payload_sha256=hashlib.sha256(buf.getvalue()).hexdigest())
    header["header_sha256"] = _header_sha256(header)
    bad = _envelope(tmp_path / "bad.holmes", header, buf.getvalue())
    with pytest.raises(ModelFileError, match=r"bad\.holmes: holds an unfitted "
                                             "RandomForestDetector"):
        load_model(bad, check_features=False)
