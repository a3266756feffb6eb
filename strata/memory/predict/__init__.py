"""Predictors of the next layers' experts, behind one interface (`base.Predictor`), one file each:
router look-ahead announcements (`lookahead.py`) and cross-layer co-occurrence (`cooccurrence.py`)."""
from .base import Prediction, Predictor, merge
from .cooccurrence import Cooccurrence, CooccurrencePredictor
from .lookahead import Lookahead, announcement

__all__ = ["Cooccurrence", "CooccurrencePredictor", "Lookahead", "Prediction", "Predictor", "announcement", "merge"]
