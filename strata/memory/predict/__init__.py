"""Predictors of the next layers' experts, behind one interface (`base.Predictor`), one file each:
router look-ahead announcements (`lookahead.py`) and cross-layer co-occurrence (`cooccurrence.py`).

Must not hold code: the package's public names, re-exported.
"""
from .base import Prediction, Predictor, merge
from .cooccurrence import Cooccurrence, CooccurrencePredictor
from .lookahead import Lookahead, announcement

__all__ = ["Cooccurrence", "CooccurrencePredictor", "Lookahead", "Prediction", "Predictor", "announcement", "merge"]
