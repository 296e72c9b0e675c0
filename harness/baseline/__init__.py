"""The baseline check: a foreign trainer's cases against an independent implementation (the
bundled PyTorch trainer run live with the subject's semantics, or recorded logs), kept apart
from the self-check in every record and report."""
