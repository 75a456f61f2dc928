"""Features for logs that arrive in batches (a node agent following live CommOps logs).

:func:`~holmes_ml.features.build_features` reads history from earlier iterations *in the same
table*; a batch holding one new iteration would have none. :class:`FeatureStream` keeps the
last few iterations as context, computes features on ``context + batch`` and returns the rows of
the batch. Because features of iteration ``k`` only read iterations ``<= k``, a batch's rows get
the same values as a single call on the whole log would give them, as long as the context
covers what they read (see ``context_iterations``).
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from holmes_ml.features.build import FeatureConfig, _check_columns, build_features

logger = logging.getLogger(__name__)

_REQUIRED = ("iteration", "rank", "op", "group", "seq", "nbytes", "start_ns", "duration_us")
_OPTIONAL = ("peer", "group_ranks", "group_kind")


def stream_context(cfg: FeatureConfig | None = None) -> int:
    """Earlier iterations a batch needs as context for the features ``cfg`` builds to be the
    whole log's: the history window and the lowest level's memory, or the iteration-time
    reference's window, and two more (see ``FeatureStream.context_iterations``)."""
    cfg = cfg or FeatureConfig()
    return max(int(cfg.window) + int(cfg.level_memory) - 1, int(cfg.irregularity.window)) + 2


class FeatureStream:
    """Incremental :func:`~holmes_ml.features.build_features` over batches of CommOps rows.

    Parameters
    ----------
    cfg:
        Feature configuration; defaults to ``FeatureConfig()``.
    context_iterations:
        How many of the most recent iterations to keep as context. The default,
        ``max(cfg.window + cfg.level_memory - 1, cfg.irregularity.window) + 2``, covers the
        op history, the lowest level (``FeatureConfig.level_memory``) and the rank-latency
        window exactly, and the iteration-time reference as long as at most one
        of those iterations was irregular (the oldest one kept lends the next its end, for
        iterations timed end to end: :func:`~holmes_ml.features.iteration_times`). Each batch
        costs feature extraction on context + batch, so batches of several iterations are
        cheaper per row than one iteration at a time.

    Examples
    --------
    >>> from holmes_ml.bench.features import synthetic_ops
    >>> ops = synthetic_ops(tp=2, pp=1, dp=2, iterations=6, seed=0)
    >>> stream = FeatureStream()
    >>> parts = [stream.update(ops[ops["iteration"] == k]) for k in range(6)]
    >>> bool((pd.concat(parts).loc[ops.index] == build_features(ops)).all().all())
    True
    """

    def __init__(self, cfg: FeatureConfig | None = None, context_iterations: int | None = None):
        self.cfg = cfg or FeatureConfig()
        if context_iterations is None:
            context_iterations = stream_context(self.cfg)
        if not isinstance(context_iterations, (int, np.integer)) or context_iterations < 0:
            raise ValueError(
                f"FeatureStream.context_iterations: got {context_iterations!r}; "
                "expected an int >= 0"
            )
        self.context_iterations = int(context_iterations)
        self._context: pd.DataFrame | None = None

    @property
    def context_rows(self) -> int:
        """Rows currently kept as context."""
        return 0 if self._context is None else len(self._context)

    def reset(self) -> None:
        """Forget the context (e.g. when the job restarts)."""
        self._context = None

    def update(self, ops: pd.DataFrame) -> pd.DataFrame:
        """Features of the rows of ``ops`` (same index and order), using the kept context.

        Parameters
        ----------
        ops:
            A batch of canonical CommOps rows, normally the newest iterations.

        Returns
        -------
        pandas.DataFrame
            As :func:`~holmes_ml.features.build_features` returns for these rows.
        """
        _check_columns(ops)
        cols = list(_REQUIRED) + [c for c in _OPTIONAL if c in ops.columns]
        batch = ops[cols].reset_index(drop=True)
        ctx = self._context
        if ctx is not None:
            shared = [c for c in cols if c in ctx.columns]
            if len(shared) < len(cols):
                logger.debug("context lacks columns %s; dropping them from this batch",
                             sorted(set(cols) - set(shared)))
            batch = batch[shared]
            combined = pd.concat([ctx[shared], batch], ignore_index=True)
            n_ctx = len(ctx)
        else:
            combined = batch
            n_ctx = 0
        feats = build_features(combined, self.cfg)
        out = feats.iloc[n_ctx:]
        out.index = ops.index
        self._keep(combined)
        return out

    def _keep(self, combined: pd.DataFrame) -> None:
        if self.context_iterations == 0 or len(combined) == 0:
            self._context = None if len(combined) == 0 else combined.iloc[:0]
            return
        it = combined["iteration"].to_numpy(dtype=np.int64)
        recent = np.unique(it)[-self.context_iterations:]
        keep = it >= recent[0]
        self._context = combined.loc[keep].reset_index(drop=True)
