-- machine_summary.agent_heartbeat_at, kept per statement instead of per row.
-- Heartbeats arrive in batches of hundreds of rows per statement; the row
-- trigger of V2 ran a PL/pgSQL upsert for each. These triggers do one
-- set-based write per statement, from the statement's transition tables
-- (which PostgreSQL allows for one event per trigger, hence three). What the
-- summary holds is unchanged.

DROP TRIGGER machine_summary_heartbeat ON machine_agent_heartbeat;
DROP FUNCTION machine_summary_on_heartbeat();

CREATE FUNCTION machine_summary_heartbeat_set() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- INSERT, or UPDATE (a heartbeat's upsert): set the new rows' times.
    -- An upsert: a machine's summary row may not exist yet inside one
    -- multi-table statement.
    INSERT INTO machine_summary (machine_id, agent_heartbeat_at)
    SELECT machine_id, agent_heartbeat_at FROM new_rows
        ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = EXCLUDED.agent_heartbeat_at;
    RETURN NULL;
END $$;

CREATE FUNCTION machine_summary_heartbeat_cleared() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- DELETE, or an UPDATE that moved a row to another machine: clear the
    -- machines that no longer have a heartbeat row.
    UPDATE machine_summary s SET agent_heartbeat_at = NULL
      FROM old_rows o
     WHERE s.machine_id = o.machine_id
       AND NOT EXISTS (SELECT 1 FROM machine_agent_heartbeat h WHERE h.machine_id = o.machine_id);
    RETURN NULL;
END $$;

CREATE FUNCTION machine_summary_heartbeat_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM old_rows o LEFT JOIN new_rows n USING (machine_id)
                WHERE n.machine_id IS NULL) THEN
        UPDATE machine_summary s SET agent_heartbeat_at = NULL
          FROM old_rows o
         WHERE s.machine_id = o.machine_id
           AND NOT EXISTS (SELECT 1 FROM machine_agent_heartbeat h WHERE h.machine_id = o.machine_id);
    END IF;
    INSERT INTO machine_summary (machine_id, agent_heartbeat_at)
    SELECT machine_id, agent_heartbeat_at FROM new_rows
        ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = EXCLUDED.agent_heartbeat_at;
    RETURN NULL;
END $$;

CREATE TRIGGER machine_summary_heartbeat_insert
    AFTER INSERT ON machine_agent_heartbeat
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION machine_summary_heartbeat_set();
CREATE TRIGGER machine_summary_heartbeat_update
    AFTER UPDATE ON machine_agent_heartbeat
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION machine_summary_heartbeat_moved();
CREATE TRIGGER machine_summary_heartbeat_delete
    AFTER DELETE ON machine_agent_heartbeat
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION machine_summary_heartbeat_cleared();

-- Room on each page for a row's next version: a heartbeat rewrites its row
-- (and the summary's) every interval; with free space on the page the new
-- heartbeat row is a HOT update (no index entry) and pages prune in place.
ALTER TABLE machine_agent_heartbeat SET (fillfactor = 70);
ALTER TABLE machine_summary SET (fillfactor = 80);
