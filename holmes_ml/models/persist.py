"""The saved-model envelope: a zip holding a JSON header and a joblib payload.

The header records the versions of holmes_ml, scikit-learn, lightgbm and numpy, the feature schema,
a hash of the training data, metrics, the sha256 of the payload and (from format version 2) the
sha256 of the header itself. :func:`load_model` checks the header before it unpickles anything:
a file that is not an envelope, whose header or payload hash does not match (an edited metric,
schema or model), is refused with :class:`ModelFileError`, and so is a payload of another class
than the header's ``estimator``; a version mismatch only warns. Files of format version 1 carry
no header hash: their header is read as it is (:func:`upgrade_envelope` rewrites one in today's
format, as the bundled model was, keeping its payload's bytes).

The hashes catch a damaged or edited file, not a forgery: whoever can write a model file can
write matching hashes. The payload is a pickle, and loading one runs whatever code it names,
so load only model files from a source you trust (the bundled one, your own ``holmes train``).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import warnings
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pandas as pd

from holmes_ml._text import few

logger = logging.getLogger(__name__)

__all__ = ["FORMAT", "ModelFileError", "data_hash", "read_header", "load_model", "save_model"]

#: Identifies the envelope format in the header (bump ``version`` on incompatible changes).
#: Version 2 added ``header_sha256``.
FORMAT = {"name": "holmes-ml-model", "version": 2}
#: Versions this holmes_ml reads: 1 (no header hash) and :data:`FORMAT`'s.
_READS = (1, 2)
_HEADER = "header.json"
_PAYLOAD = "model.joblib"
_LIBS = {"holmes_ml": "holmes-ml", "sklearn": "scikit-learn", "lightgbm": "lightgbm",
         "numpy": "numpy"}


class ModelFileError(ValueError):
    """A model file is foreign, damaged or tampered with (the message names the file and why)."""


def _versions() -> dict[str, str]:
    out = {}
    for key, dist in _LIBS.items():
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = "missing"
    return out


def data_hash(*arrays: Any) -> str:
    """sha256 over the bytes of the given arrays/DataFrames (the training-data fingerprint)."""
    h = hashlib.sha256()
    for a in arrays:
        if a is None:
            continue
        if isinstance(a, pd.DataFrame | pd.Series):
            h.update(pd.util.hash_pandas_object(a, index=False).to_numpy().tobytes())
        else:
            h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()


#: What a fitted detector chose, kept in the envelope's ``extra.fitted`` (read without loading).
_FITTED_FACTS = ("threshold_", "best_params_", "best_score_", "n_trials_", "study_name_")


def fitted_facts(model: Any) -> dict[str, Any]:
    """What ``model`` chose when it was fitted, as JSON-able values: its decision threshold
    and, for a tuned one, the tuned parameters, their out-of-fold F1, the trials it chose
    among and its study's name (of a screened or drift-aware wrapper: its detector's)."""
    inner = getattr(model, "detector_", None)
    if inner is None:  # (not `or`: an ensemble's truth is its length)
        inner = getattr(model, "detector", None)
    out: dict[str, Any] = {}
    for obj in (inner, model):
        for name in _FITTED_FACTS:
            value = getattr(obj, name, None) if obj is not None else None
            if isinstance(value, np.generic):
                value = value.item()
            if isinstance(value, dict):
                value = {str(k): v.item() if isinstance(v, np.generic) else v
                         for k, v in value.items()}
            if value is not None and isinstance(value, (int, float, str, dict)):
                out[name.rstrip("_")] = value
    return out


def _not_a_detector(model: Any) -> str | None:
    """Why ``model`` is no holmes_ml detector, or None when it is one. Any object with a
    ``decision_function`` would score, but only ours return P(abnormal) in [0, 1] that a
    threshold means something on (a LogisticRegression's are unbounded margins)."""
    from holmes_ml.models.detectors import BinaryDetectorMixin, _UnsupervisedDetector

    if isinstance(model, (BinaryDetectorMixin, _UnsupervisedDetector)):
        from sklearn.exceptions import NotFittedError
        from sklearn.utils.validation import check_is_fitted

        try:
            check_is_fitted(model)
        except NotFittedError:  # saved, it loaded and failed only when it came to score
            return (f"an unfitted {type(model).__name__} (expected a detector whose fit has "
                    "run, e.g. by holmes train)")
        return None
    return (f"a {type(model).__name__}, not a detector of holmes_ml "
            "(expected one of holmes_ml.models' detectors, whose decision_function is "
            "P(abnormal) in [0, 1])")


def _header_sha256(header: dict[str, Any]) -> str:
    """sha256 of the header without its own ``header_sha256``, as canonical JSON (sorted keys,
    no whitespace: the same however the file's JSON is laid out)."""
    body = {k: v for k, v in header.items() if k != "header_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
                          ).hexdigest()


def save_model(
    model: Any,
    path: str | Path,
    metrics: dict[str, float] | None = None,
    training_data: Any = None,
    feature_columns: tuple[str, ...] | list[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` into a checked envelope at ``path``.

    Parameters
    ----------
    model:
        A fitted holmes_ml detector (:mod:`holmes_ml.models`); any other object is refused.
    path:
        Output file (``.holmes`` by convention).
    metrics:
        Figures to keep with the model (e.g. held-out F1).
    training_data:
        ``X`` or ``(X, y)``; only its sha256 is stored.
    feature_columns:
        The feature schema; defaults to ``model.feature_names_in_`` when present (a model
        fitted on a DataFrame). Without either, a warning: :func:`load_model` can then only
        check the number of features.
    extra:
        Any other JSON-serializable facts (training command, scenarios). ``extra.fitted`` is
        added: what the model chose when fitted (:func:`fitted_facts`).

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    TypeError
        ``model`` is no holmes_ml detector (a scikit-learn classifier's ``decision_function``
        is no probability: thresholded like one, it would flag at random).
    """
    path = Path(path)
    why = _not_a_detector(model)
    if why is not None:
        raise TypeError(f"save_model: model is {why}")
    buf = io.BytesIO()
    joblib.dump(model, buf, compress=3)
    payload = buf.getvalue()
    if feature_columns is None and hasattr(model, "feature_names_in_"):
        feature_columns = [str(c) for c in model.feature_names_in_]
    if feature_columns is None:
        warnings.warn(
            f"save_model {path}: the model was fitted on an array without column names, so its "
            "envelope records no feature schema and load_model cannot check the features "
            "come in the order it learnt; fit it on the DataFrame build_features returns, or "
            "pass feature_columns=", UserWarning, stacklevel=2)
    if isinstance(training_data, tuple):
        th = data_hash(*training_data)
    elif training_data is not None:
        th = data_hash(training_data)
    else:
        th = None
    header = {
        "format": FORMAT,
        "estimator": type(model).__name__,
        "versions": _versions(),
        "feature_columns": list(feature_columns) if feature_columns is not None else None,
        "training_data_sha256": th,
        "metrics": {k: float(v) for k, v in (metrics or {}).items()},
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "extra": {**(extra or {}), "fitted": fitted_facts(model)},
    }
    _write(path, header, payload)
    logger.info("saved %s (%d bytes) to %s", type(model).__name__, path.stat().st_size, path)
    return path


def _write(path: Path, header: dict[str, Any], payload: bytes) -> None:
    """The envelope: ``header`` (hashed here) and ``payload`` in a zip at ``path``."""
    header["header_sha256"] = _header_sha256(header)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Fixed timestamps keep the file byte-identical for identical models.
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in ((_HEADER, json.dumps(header, indent=2).encode()), (_PAYLOAD, payload)):
            zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)


def upgrade_envelope(path: str | Path, out: str | Path | None = None) -> Path:
    """Rewrite an envelope of an older format version in :data:`FORMAT` (to ``out``, else in
    place), after :func:`load_model`'s checks: the payload's bytes, and so its hash, stay as
    they are; the header keeps every fact and gains the header hash. Returns the path."""
    path = Path(path)
    load_model(path, check_features=False)  # the checks; a damaged file is refused here
    header, payload = _open(path, payload=True)
    assert payload is not None
    header = {k: v for k, v in header.items() if k != "header_sha256"}
    was = header["format"]["version"]
    if was == FORMAT["version"] and out is None:
        return path  # nothing to upgrade
    header["format"] = dict(FORMAT)
    header["extra"] = {**(header.get("extra") or {}), "upgraded_from_format": was}
    target = Path(out) if out is not None else path
    _write(target, header, payload)
    return target


def read_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of an envelope, without loading the model (checked against its hash
    from format version 2 on)."""
    header, _ = _open(Path(path), payload=False)
    return header


def _open(path: Path, payload: bool) -> tuple[dict[str, Any], bytes | None]:
    if not path.is_file():
        if path.is_dir():
            raise ModelFileError(f"{path}: a directory, not a model file (expected a model "
                                 "envelope written by holmes train)")
        if path.exists():  # a FIFO would block the read forever, /dev/zero never end it
            raise ModelFileError(f"{path}: not a regular file (a FIFO, socket or device); "
                                 "expected a model envelope written by holmes train")
        raise ModelFileError(f"{path}: no such model file")
    if not zipfile.is_zipfile(path):
        raise ModelFileError(
            f"{path}: not a holmes_ml model envelope, or a truncated one (expected a zip "
            f"with {_HEADER}; refusing to unpickle a foreign file)"
        )
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            if _HEADER not in names or _PAYLOAD not in names:
                raise ModelFileError(
                    f"{path}: not a holmes_ml model envelope (has {sorted(names)}; "
                    f"expected {_HEADER} and {_PAYLOAD})"
                )
            header = json.loads(zf.read(_HEADER))
            data = zf.read(_PAYLOAD) if payload else None
    except (zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path}: damaged model envelope ({exc})") from exc
    fmt = header.get("format") if isinstance(header, dict) else None
    if not isinstance(fmt, dict) or fmt.get("name") != FORMAT["name"]:
        raise ModelFileError(f"{path}: header format is {fmt!r}; expected {FORMAT}")
    if fmt.get("version") not in _READS:
        raise ModelFileError(
            f"{path}: envelope version {fmt.get('version')!r}; this holmes_ml reads "
            f"versions {', '.join(map(str, _READS))}"
        )
    if fmt.get("version") != 1:
        digest = _header_sha256(header)
        if digest != header.get("header_sha256"):
            raise ModelFileError(
                f"{path}: header sha256 {digest[:16]}... does not match the one it records "
                f"({str(header.get('header_sha256'))[:16]}...); the file was modified — "
                "refusing to load"
            )
    return header, data


def _check_feature_count(path: Path, model: Any) -> None:
    """A model whose envelope records no feature schema (fitted on an unnamed array) must at
    least take as many features as :func:`~holmes_ml.features.build_features` gives."""
    from holmes_ml.features import FEATURE_COLUMNS

    n = getattr(model, "n_features_in_", None)
    if n is None or int(n) == len(FEATURE_COLUMNS):
        return
    raise ModelFileError(
        f"{path}: takes {int(n)} features and records no feature schema; holmes_ml builds "
        f"{len(FEATURE_COLUMNS)} (FEATURE_COLUMNS): retrain it on the table build_features "
        "returns, or load it with check_features=False to score features of your own")


def load_model(path: str | Path, check_features: bool = True) -> Any:
    """Load a model saved by :func:`save_model`, after checking its envelope.

    Raises
    ------
    ModelFileError
        The file is not an envelope, is damaged, or its header's or payload's hash does not
        match (edited: a version-1 file has no header hash); its feature schema differs from
        :data:`holmes_ml.features.FEATURE_COLUMNS` (or, when it records none, the model takes
        another number of features); its payload does not unpickle here, is no
        holmes_ml detector (an estimator of another library, whose ``decision_function`` is
        no probability), or is of another class than the header's ``estimator``. The checks
        are no defence against a forged file (see the module's note): load only model files
        you trust.

    Warns
    -----
    UserWarning
        When it was saved with other versions of holmes_ml / scikit-learn / lightgbm / numpy.
    """
    path = Path(path)
    header, payload = _open(path, payload=True)
    assert payload is not None
    digest = hashlib.sha256(payload).hexdigest()
    if digest != header.get("payload_sha256"):
        raise ModelFileError(
            f"{path}: payload sha256 {digest[:16]}... does not match the header's "
            f"{str(header.get('payload_sha256'))[:16]}...; the file was modified — refusing to load"
        )
    if check_features and header.get("feature_columns") is not None:
        from holmes_ml.features import FEATURE_COLUMNS

        saved_cols = [str(c) for c in header["feature_columns"]]
        if saved_cols != list(FEATURE_COLUMNS):
            missing = [c for c in FEATURE_COLUMNS if c not in saved_cols]
            extra = [c for c in saved_cols if c not in FEATURE_COLUMNS]

            how = "; ".join(filter(None, [
                f"lacks {few(missing, 5, ', ')}" if missing else "",
                f"has {few(extra, 5, ', ')}, which this version does not build" if extra else "",
            ]))
            if not how:  # the same names: in another order, or one of them twice
                apart = next((f"{a} where this version has {b}" for a, b in
                              zip(saved_cols, FEATURE_COLUMNS, strict=False) if a != b), None)
                how = (f"holds the same columns in another order (first apart: {apart})"
                       if apart else "names a column twice")
            raise ModelFileError(
                f"{path}: feature schema of {len(saved_cols)} columns differs from this "
                f"holmes_ml's FEATURE_COLUMNS ({len(FEATURE_COLUMNS)}): it {how}; retrain "
                "with `holmes train`"
            )
    saved, now = header.get("versions", {}), _versions()
    if not isinstance(saved, dict):
        raise ModelFileError(f"{path}: header field 'versions' is {saved!r}; expected an object "
                             "of library versions (a damaged or hand-made envelope)")
    drift = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
    if drift:
        msg = ", ".join(f"{k} saved {a} now {b}" for k, (a, b) in drift.items())
        warnings.warn(f"{path}: model saved with other library versions ({msg})", stacklevel=2)
    try:
        model = joblib.load(io.BytesIO(payload))
    except Exception as exc:  # noqa: BLE001 - unpickling raises whatever the payload's classes do
        raise ModelFileError(
            f"{path}: saved by holmes_ml {saved.get('holmes_ml')} with objects this version "
            f"cannot load ({type(exc).__name__}: {exc}); retrain it with `holmes train`") from exc
    why = _not_a_detector(model)
    if why is not None:
        raise ModelFileError(f"{path}: holds {why}")
    named = header.get("estimator")
    if named != type(model).__name__:
        raise ModelFileError(f"{path}: header names estimator {named!r} but the payload holds "
                             f"a {type(model).__name__}; the file was modified — refusing to "
                             "load")
    if check_features and header.get("feature_columns") is None:
        _check_feature_count(path, model)
    return model
