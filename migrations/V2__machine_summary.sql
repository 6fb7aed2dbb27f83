-- machine_summary: one row per machine, derived from its tags by triggers, so
-- that the "needs agent start" and "needs recovery" selectors are index range
-- scans over due machines instead of anti-joins over the whole fleet.
--
-- Nothing writes this table but the triggers below. Any tool that writes the
-- contract tables keeps it true without knowing it exists.

CREATE TABLE machine_summary (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- machine_provided.provider, NULL when not provided.
    provider provider NULL,
    -- machine_agent_started.agent_started_at, NULL without the tag.
    agent_started_at timestamptz NULL,
    -- machine_agent_heartbeat.agent_heartbeat_at, NULL without the tag.
    agent_heartbeat_at timestamptz NULL,
    -- An installation request whose generation equals the report's.
    installation_fulfilled boolean NOT NULL DEFAULT false,
    -- work_backoff.until of ShepherdAgentStart / ShepherdRecovery, or -infinity.
    agent_start_not_before timestamptz NOT NULL DEFAULT '-infinity',
    recovery_not_before timestamptz NOT NULL DEFAULT '-infinity',
    -- A work row of ShepherdAccess, ShepherdAgentStart or ShepherdRecovery
    -- exists (they exclude each other, so there is at most one).
    shepherd_work boolean NOT NULL DEFAULT false
);

-- Needs agent start: provided, no agent, not installed; ordered by backoff so
-- the eligible machines (not_before <= now()) are a prefix of the range.
CREATE INDEX machine_summary_agent_start ON machine_summary (provider, agent_start_not_before)
    WHERE agent_started_at IS NULL AND NOT installation_fulfilled AND provider IS NOT NULL;
-- Needs recovery, heartbeat gone stale.
CREATE INDEX machine_summary_recovery_stale ON machine_summary (provider, agent_heartbeat_at, recovery_not_before)
    WHERE agent_started_at IS NOT NULL AND agent_heartbeat_at IS NOT NULL AND NOT installation_fulfilled;
-- Needs recovery, no heartbeat ever since the agent started.
CREATE INDEX machine_summary_recovery_silent ON machine_summary (provider, agent_started_at, recovery_not_before)
    WHERE agent_started_at IS NOT NULL AND agent_heartbeat_at IS NULL AND NOT installation_fulfilled;

-- Backfill for databases that already hold machines.
INSERT INTO machine_summary (machine_id, provider, agent_started_at, agent_heartbeat_at,
                             installation_fulfilled, agent_start_not_before, recovery_not_before,
                             shepherd_work)
SELECT m.machine_id,
       p.provider,
       s.agent_started_at,
       h.agent_heartbeat_at,
       COALESCE(rq.generation = rp.generation, false),
       COALESCE((SELECT until FROM work_backoff b
                  WHERE b.machine_id = m.machine_id AND b.process = 'ShepherdAgentStart'), '-infinity'),
       COALESCE((SELECT until FROM work_backoff b
                  WHERE b.machine_id = m.machine_id AND b.process = 'ShepherdRecovery'), '-infinity'),
       EXISTS (SELECT 1 FROM work w WHERE w.machine_id = m.machine_id
                  AND w.process IN ('ShepherdAccess', 'ShepherdAgentStart', 'ShepherdRecovery'))
  FROM machines m
  LEFT JOIN machine_provided p ON p.machine_id = m.machine_id
  LEFT JOIN machine_agent_started s ON s.machine_id = m.machine_id
  LEFT JOIN machine_agent_heartbeat h ON h.machine_id = m.machine_id
  LEFT JOIN machine_os_installation_request rq ON rq.machine_id = m.machine_id
  LEFT JOIN machine_os_installation_report rp ON rp.machine_id = m.machine_id;

CREATE FUNCTION machine_summary_on_machine() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO machine_summary (machine_id) VALUES (NEW.machine_id) ON CONFLICT (machine_id) DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_machine AFTER INSERT ON machines
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_machine();

-- Tag triggers: on DELETE (or a machine_id change) clear the old machine's
-- column; on INSERT/UPDATE set the new one (upsert: the machines trigger may
-- not have run yet inside one multi-table statement).
CREATE FUNCTION machine_summary_on_provided() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        UPDATE machine_summary SET provider = NULL WHERE machine_id = OLD.machine_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO machine_summary (machine_id, provider) VALUES (NEW.machine_id, NEW.provider)
            ON CONFLICT (machine_id) DO UPDATE SET provider = EXCLUDED.provider;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_provided
    AFTER INSERT OR DELETE OR UPDATE OF machine_id, provider ON machine_provided
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_provided();

CREATE FUNCTION machine_summary_on_agent_started() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        UPDATE machine_summary SET agent_started_at = NULL WHERE machine_id = OLD.machine_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO machine_summary (machine_id, agent_started_at) VALUES (NEW.machine_id, NEW.agent_started_at)
            ON CONFLICT (machine_id) DO UPDATE SET agent_started_at = EXCLUDED.agent_started_at;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_agent_started
    AFTER INSERT OR DELETE OR UPDATE OF machine_id, agent_started_at ON machine_agent_started
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_agent_started();

CREATE FUNCTION machine_summary_on_heartbeat() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        UPDATE machine_summary SET agent_heartbeat_at = NULL WHERE machine_id = OLD.machine_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO machine_summary (machine_id, agent_heartbeat_at) VALUES (NEW.machine_id, NEW.agent_heartbeat_at)
            ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = EXCLUDED.agent_heartbeat_at;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_heartbeat
    AFTER INSERT OR DELETE OR UPDATE OF machine_id, agent_heartbeat_at ON machine_agent_heartbeat
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_heartbeat();

-- Installation is fulfilled when request and report carry the same generation.
CREATE FUNCTION machine_summary_installation(mid uuid) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE machine_summary SET installation_fulfilled = COALESCE((
        SELECT rq.generation = rp.generation
          FROM machine_os_installation_request rq
          JOIN machine_os_installation_report rp ON rp.machine_id = rq.machine_id
         WHERE rq.machine_id = mid), false)
     WHERE machine_id = mid;
END $$;
CREATE FUNCTION machine_summary_on_installation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        PERFORM machine_summary_installation(OLD.machine_id);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO machine_summary (machine_id) VALUES (NEW.machine_id) ON CONFLICT (machine_id) DO NOTHING;
        PERFORM machine_summary_installation(NEW.machine_id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_installation_request
    AFTER INSERT OR DELETE OR UPDATE OF machine_id, generation ON machine_os_installation_request
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_installation();
CREATE TRIGGER machine_summary_installation_report
    AFTER INSERT OR DELETE OR UPDATE OF machine_id, generation ON machine_os_installation_report
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_installation();

-- Backoffs of the two selector-driven processes.
CREATE FUNCTION machine_summary_on_backoff() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        IF OLD.process = 'ShepherdAgentStart' THEN
            UPDATE machine_summary SET agent_start_not_before = '-infinity' WHERE machine_id = OLD.machine_id;
        ELSIF OLD.process = 'ShepherdRecovery' THEN
            UPDATE machine_summary SET recovery_not_before = '-infinity' WHERE machine_id = OLD.machine_id;
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        IF NEW.process = 'ShepherdAgentStart' THEN
            INSERT INTO machine_summary (machine_id, agent_start_not_before) VALUES (NEW.machine_id, NEW.until)
                ON CONFLICT (machine_id) DO UPDATE SET agent_start_not_before = EXCLUDED.agent_start_not_before;
        ELSIF NEW.process = 'ShepherdRecovery' THEN
            INSERT INTO machine_summary (machine_id, recovery_not_before) VALUES (NEW.machine_id, NEW.until)
                ON CONFLICT (machine_id) DO UPDATE SET recovery_not_before = EXCLUDED.recovery_not_before;
        END IF;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_backoff
    AFTER INSERT OR DELETE OR UPDATE OF machine_id, process, until ON work_backoff
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_backoff();

-- Leases of the three mutually exclusive shepherd processes.
CREATE FUNCTION machine_summary_on_work() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'UPDATE')
       AND OLD.process IN ('ShepherdAccess', 'ShepherdAgentStart', 'ShepherdRecovery') THEN
        UPDATE machine_summary SET shepherd_work = false WHERE machine_id = OLD.machine_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE')
       AND NEW.process IN ('ShepherdAccess', 'ShepherdAgentStart', 'ShepherdRecovery') THEN
        INSERT INTO machine_summary (machine_id, shepherd_work) VALUES (NEW.machine_id, true)
            ON CONFLICT (machine_id) DO UPDATE SET shepherd_work = true;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_work
    AFTER INSERT OR DELETE OR UPDATE OF machine_id, process ON work
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_work();
