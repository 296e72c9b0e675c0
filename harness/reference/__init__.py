"""Single-device references: keyed, built once across workers and sessions, verified on reuse."""

from .cache import (
    ReferenceCache,
    ReferenceEntry,
    ReferenceError,
    file_sha256,
    key_digest,
    reference_key,
)

__all__ = ["ReferenceCache", "ReferenceEntry", "ReferenceError", "file_sha256", "key_digest",
           "reference_key"]
