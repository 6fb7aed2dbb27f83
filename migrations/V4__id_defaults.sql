-- CONTRACTS.md §2: existing tools create machines and sessions without
-- naming the key (`INSERT INTO machines (machine_created_at) VALUES (now())
-- RETURNING *`); the ids default to a random UUID. gen_random_uuid() is
-- built in from PostgreSQL 13 (and CockroachDB).
ALTER TABLE machines ALTER COLUMN machine_id SET DEFAULT gen_random_uuid();
ALTER TABLE sessions ALTER COLUMN session_id SET DEFAULT gen_random_uuid();
