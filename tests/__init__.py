"""ada_jax test suite (a package so test modules share fixtures)."""
