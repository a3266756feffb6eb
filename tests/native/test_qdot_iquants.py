"""Names other test modules import from here (tests/engine/test_iquant_models.py: SCALES); the tests
themselves are in test_qdot.py and test_qdot_tiles.py. Remove once those import from qdot_cases."""
from tests.native.qdot_cases import SCALES  # noqa: F401
