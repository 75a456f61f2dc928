"""Constants of robust statistics shared by the simulator's labels, the features and the
pipeline."""

from __future__ import annotations

#: A normal spread's standard deviation over its median absolute deviation: 1.4826 x MAD
#: estimates sigma (the labels' crowd, the features' z-scores, the localizer's waits).
MAD_TO_SD = 1.4826
