"""Predictors of the next layers' experts, behind one interface (`base.Predictor`), one file each:
router look-ahead announcements (`lookahead.py`), its learned correction (`correction.py`) and
cross-layer co-occurrence (`cooccurrence.py`);
their precision and recall per depth (`score.py`).

Must not hold code: the package's public names, re-exported.
"""
from .base import LOOK_AHEAD, Prediction, Predictor, merge
from .cooccurrence import Cooccurrence, CooccurrencePredictor
from .correction import LookaheadCorrection, RidgeFit
from .lookahead import Lookahead, announcement
from .score import DepthCounts, PredictionScore

__all__ = ["LOOK_AHEAD", "Cooccurrence", "DepthCounts", "PredictionScore", "CooccurrencePredictor", "Lookahead", "LookaheadCorrection", "Prediction", "Predictor", "RidgeFit", "announcement", "merge"]
