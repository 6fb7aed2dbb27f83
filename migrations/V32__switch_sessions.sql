-- How many sessions shepherd held with each switch (those that changed
-- or read ports, and those that failed) and how long they took in all:
-- a switch that slows down shows here before it fails.
ALTER TABLE switch_state
    ADD COLUMN sessions bigint NOT NULL DEFAULT 0,
    ADD COLUMN session_seconds double precision NOT NULL DEFAULT 0;
