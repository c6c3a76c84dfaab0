"""Everything that talks to PostgreSQL: the named statements (`queries/`) and what
sends them (`sql`), the application's own connections (`drivers`), the migrations
(`schema`), and the lifecycle calls by role: `enqueue`, `claim`, the pipelined round
trip (`roundtrip`), `writeback` and `admin`; flow control's storage (`limits`)."""
