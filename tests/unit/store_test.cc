// Store tests (being written).
