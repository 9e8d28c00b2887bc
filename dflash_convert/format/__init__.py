"""Facts about the formats, as plain data tables. Code elsewhere reads these; it never spells a key."""
