// SQLite store (being written).
