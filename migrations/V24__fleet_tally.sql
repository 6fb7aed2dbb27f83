-- The fleet read flat with its size: every machine's state kept in its
-- summary row, and the count of machines per state kept in a tally,
-- so that the fleet page, the fleet list and /metrics read an index range
-- and a few dozen rows, not every machine.
--
-- 1. machine_state(s): a machine's life-cycle state from its summary row.
--    The one home of that derivation (shepherd's `state_column!` calls it).
--    It reads the provider's record through two summary columns kept here
--    (provider_id, address), so a row alone is enough.
-- 2. machine_summary.state, set by a BEFORE trigger from machine_state, and
--    state_until: when a backoff in it runs out and the state may change
--    with no row written. Such rows are settled (state_until set to NULL,
--    which recomputes both) by any reader before it reads, and by the
--    fleet-tally round (`bmdb::machines::settle`).
-- 3. machine_tally: machines per state (and with a started agent, key
--    'agents'). Triggers append signed deltas to machine_tally_delta, with
--    no lock on a shared row; the round folds them in. A count is the
--    tally plus its pending deltas.

ALTER TABLE machine_summary
    -- machine_provided.provider_id and provider_ip_address, NULL when not
    -- provided: the listing's order and search, and the state's input.
    ADD COLUMN provider_id varchar(128) NULL,
    ADD COLUMN address text NULL,
    ADD COLUMN state text NOT NULL DEFAULT 'unprovided',
    ADD COLUMN state_until timestamptz NULL;

CREATE FUNCTION machine_state(s machine_summary) RETURNS text LANGUAGE sql STABLE AS $$
SELECT CASE WHEN s.service = 'servicing' AND (s.shepherd_work OR NOT s.held) THEN 'servicing'
            WHEN s.shepherd_work AND s.boot_request = 'inspect' THEN 'inspecting'
            WHEN s.shepherd_work AND s.boot_request IS NOT NULL AND s.boot_request <> 'disk'
                 THEN 'enrolling'
            WHEN s.shepherd_work THEN 'leased'
            WHEN s.held THEN 'held'
            WHEN s.discovered THEN 'discovered'
            WHEN s.service = 'failed' THEN 'service-failed'
            WHEN ((s.boot_request IS NOT NULL AND s.boot_request <> 'disk')
                      OR (s.bmc_boot AND s.agent_started_at IS NULL
                      AND NOT s.installation_fulfilled AND s.address IS NULL))
                 AND s.agent_start_not_before > now() THEN 'enroll-failed'
            WHEN s.boot_request = 'inspect' THEN 'inspecting'
            WHEN s.boot_request IS NOT NULL AND s.boot_request <> 'disk' THEN 'enrolling'
            WHEN s.bmc_boot AND s.agent_started_at IS NULL AND NOT s.installation_fulfilled
                 AND s.address IS NULL THEN 'enrolling'
            WHEN s.installation IN ('installing', 'cleaning') AND s.agent_started_at IS NOT NULL
                 AND NOT s.installation_fulfilled THEN s.installation
            WHEN s.installation = 'clean-failed' AND s.installation_fulfilled
                 THEN 'clean-failed'
            WHEN s.live_agent AND s.agent_started_at IS NOT NULL
                 AND s.recovery_not_before <= now()
                 AND (s.installation IS NULL OR s.installation = 'available') THEN 'available'
            WHEN s.installation_fulfilled THEN COALESCE(s.installation, 'installed')
            WHEN s.agent_started_at IS NOT NULL AND s.recovery_not_before > now()
                 THEN 'recovery-backoff'
            WHEN s.agent_started_at IS NOT NULL THEN 'agent-started'
            WHEN s.provider IS NULL THEN 'unprovided'
            WHEN s.agent_start_not_before > now() THEN 'backoff'
            ELSE 'pending' END
$$;

-- When the state may change by time alone: the nearer backoff still ahead.
CREATE FUNCTION machine_state_until(s machine_summary) RETURNS timestamptz LANGUAGE sql STABLE AS $$
SELECT LEAST(CASE WHEN s.agent_start_not_before > now() THEN s.agent_start_not_before END,
             CASE WHEN s.recovery_not_before > now() THEN s.recovery_not_before END)
$$;

-- The provider's record, as the summary carries it.
CREATE OR REPLACE FUNCTION machine_summary_on_provided() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.machine_id <> NEW.machine_id) THEN
        UPDATE machine_summary SET provider = NULL, provider_id = NULL, address = NULL
         WHERE machine_id = OLD.machine_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO machine_summary (machine_id, provider, provider_id, address)
            VALUES (NEW.machine_id, NEW.provider, NEW.provider_id, NEW.provider_ip_address)
            ON CONFLICT (machine_id) DO UPDATE SET provider = EXCLUDED.provider,
                provider_id = EXCLUDED.provider_id, address = EXCLUDED.address;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER machine_summary_provided ON machine_provided;
CREATE TRIGGER machine_summary_provided
    AFTER INSERT OR DELETE OR UPDATE OF machine_id, provider, provider_id, provider_ip_address
    ON machine_provided
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_provided();

-- Backfill, before the state and tally triggers exist.
UPDATE machine_summary s SET provider_id = p.provider_id, address = p.provider_ip_address
  FROM machine_provided p WHERE p.machine_id = s.machine_id;
UPDATE machine_summary s SET state = machine_state(s), state_until = machine_state_until(s);

CREATE FUNCTION machine_summary_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.state := machine_state(NEW);
    NEW.state_until := machine_state_until(NEW);
    RETURN NEW;
END $$;
CREATE TRIGGER machine_summary_state_insert BEFORE INSERT ON machine_summary
    FOR EACH ROW EXECUTE FUNCTION machine_summary_state();
-- Only when an input of the state changed (a heartbeat is none), or a
-- settle cleared state_until.
CREATE TRIGGER machine_summary_state_update BEFORE UPDATE ON machine_summary
    FOR EACH ROW
    WHEN ((OLD.service, OLD.shepherd_work, OLD.held, OLD.discovered, OLD.boot_request,
           OLD.bmc_boot, OLD.agent_started_at, OLD.installation_fulfilled, OLD.installation,
           OLD.live_agent, OLD.agent_start_not_before, OLD.recovery_not_before, OLD.provider,
           OLD.address, OLD.state_until)
          IS DISTINCT FROM
          (NEW.service, NEW.shepherd_work, NEW.held, NEW.discovered, NEW.boot_request,
           NEW.bmc_boot, NEW.agent_started_at, NEW.installation_fulfilled, NEW.installation,
           NEW.live_agent, NEW.agent_start_not_before, NEW.recovery_not_before, NEW.provider,
           NEW.address, NEW.state_until))
    EXECUTE FUNCTION machine_summary_state();

-- The listing: in provider ID order, whole or by state; rows to settle.
CREATE INDEX machine_summary_listing ON machine_summary (provider_id, machine_id);
CREATE INDEX machine_summary_listing_state ON machine_summary (state, provider_id, machine_id);
CREATE INDEX machine_summary_state_until ON machine_summary (state_until)
    WHERE state_until IS NOT NULL;
-- Silent agents, counted without reading the heartbeating ones.
CREATE INDEX machine_summary_agent_heartbeat ON machine_summary (agent_heartbeat_at)
    WHERE agent_started_at IS NOT NULL;

CREATE TABLE machine_tally (
    -- A state's name, or 'agents' (machines with a started agent).
    key text PRIMARY KEY,
    n bigint NOT NULL
);
-- Signed changes not yet folded into machine_tally. Append-only: writers
-- never wait on each other.
CREATE TABLE machine_tally_delta (
    key text NOT NULL,
    n bigint NOT NULL
);

INSERT INTO machine_tally (key, n)
SELECT state, count(*) FROM machine_summary GROUP BY state
UNION ALL
SELECT 'agents', count(*) FROM machine_summary WHERE agent_started_at IS NOT NULL;

-- Inserted and deleted rows per statement (a seed of a million rows is one
-- statement); an update per row, only when the state or the agent changed.
CREATE FUNCTION machine_tally_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO machine_tally_delta (key, n)
    SELECT state, count(*) FROM new_rows GROUP BY state
    UNION ALL
    SELECT 'agents', count(*) FROM new_rows WHERE agent_started_at IS NOT NULL HAVING count(*) > 0;
    RETURN NULL;
END $$;
CREATE FUNCTION machine_tally_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO machine_tally_delta (key, n)
    SELECT state, -count(*) FROM old_rows GROUP BY state
    UNION ALL
    SELECT 'agents', -count(*) FROM old_rows WHERE agent_started_at IS NOT NULL HAVING count(*) > 0;
    RETURN NULL;
END $$;
CREATE FUNCTION machine_tally_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state <> NEW.state THEN
        INSERT INTO machine_tally_delta (key, n) VALUES (OLD.state, -1), (NEW.state, 1);
    END IF;
    IF (OLD.agent_started_at IS NULL) <> (NEW.agent_started_at IS NULL) THEN
        INSERT INTO machine_tally_delta (key, n)
            VALUES ('agents', CASE WHEN NEW.agent_started_at IS NULL THEN -1 ELSE 1 END);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_tally_insert AFTER INSERT ON machine_summary
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION machine_tally_inserted();
CREATE TRIGGER machine_tally_delete AFTER DELETE ON machine_summary
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION machine_tally_deleted();
CREATE TRIGGER machine_tally_update AFTER UPDATE ON machine_summary
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          OR (OLD.agent_started_at IS NULL) IS DISTINCT FROM (NEW.agent_started_at IS NULL))
    EXECUTE FUNCTION machine_tally_updated();
