"""Where the tests find the project and the real SQuAD 2.0 dev sample read from ../shared (never copied in)."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_SQUAD_SAMPLE = PROJECT_ROOT.parent / "shared" / "data" / "squad2-dev-sample.json"
