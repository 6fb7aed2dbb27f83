-- Faults in the middle of the life cycle (issue 40): an installation or an
-- erasure that began again from the start is history, and one that did
-- not move for too long is failed with its cause instead of waiting for
-- ever.

-- What the BMDB compares between two progress reports of one generation
-- (InstallationProgress.phase and bytes_written, beside the bytes), and
-- when the work last moved: its phase changed or its bytes grew.
ALTER TABLE machine_installation_progress
    ADD COLUMN phase int NULL,
    ADD COLUMN bytes_written bigint NULL,
    ADD COLUMN advanced_at timestamptz NULL;
UPDATE machine_installation_progress SET advanced_at = progress_at;

-- restarted: the agent began the generation again from the start (a new
-- agent after the machine was lost, or the agent restarted), never resumed
-- on trust. timed-out: shepherd failed the generation, nothing having
-- moved for installations.deadline (its cause in the detail).
ALTER TABLE installation_history DROP CONSTRAINT installation_history_event_check;
ALTER TABLE installation_history ADD CONSTRAINT installation_history_event_check
    CHECK (event IN ('requested', 'installed', 'failed', 'erase-requested', 'erased', 'erase-failed',
                     'restarted', 'timed-out'));

-- The phases' names, as the agent's InstallationProgress.Phase numbers them.
CREATE FUNCTION installation_phase_name(phase int) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE phase WHEN 1 THEN 'preparing' WHEN 2 THEN 'writing' WHEN 3 THEN 'verifying'
                      WHEN 4 THEN 'done' WHEN 5 THEN 'failed' WHEN 6 THEN 'rebooting'
                      WHEN 7 THEN 'erasing' WHEN 8 THEN 'first-boot' ELSE 'unknown' END
$$;

CREATE FUNCTION installation_progress_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR OLD.generation IS DISTINCT FROM NEW.generation THEN
        NEW.advanced_at := NEW.progress_at;
        RETURN NEW;
    END IF;
    IF NEW.phase IS DISTINCT FROM OLD.phase OR NEW.bytes_written IS DISTINCT FROM OLD.bytes_written THEN
        NEW.advanced_at := NEW.progress_at;
    ELSE
        NEW.advanced_at := OLD.advanced_at;
    END IF;
    -- Under way (writing, verifying, erasing, the first-boot volume), then
    -- preparing again or fewer bytes: begun again from the start.
    IF OLD.phase IN (2, 3, 7, 8)
       AND (NEW.phase = 1 OR (NEW.phase IN (2, 7) AND NEW.bytes_written < OLD.bytes_written)) THEN
        INSERT INTO installation_history (machine_id, generation, event, "timestamp", detail)
        VALUES (NEW.machine_id, NEW.generation, 'restarted', now(),
                format('begun again from the start: it had reached %s, %s written, at %s',
                       installation_phase_name(OLD.phase), pg_size_pretty(OLD.bytes_written),
                       to_char(OLD.progress_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"')));
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER installation_progress_moved
    BEFORE INSERT OR UPDATE ON machine_installation_progress
    FOR EACH ROW EXECUTE FUNCTION installation_progress_moved();

-- The unanswered generations, found without scanning the fleet: the
-- deadline's round reads these.
CREATE INDEX machine_summary_installing ON machine_summary (machine_id)
    WHERE installation IN ('installing', 'cleaning');

-- The restart from the disk after an installation (V13) is asked when the
-- report says so the first time, not again when the same report is sent
-- again (its answer lost, the database away): a second BMC restart of a
-- machine already running its installed system.
CREATE OR REPLACE FUNCTION machine_boot_after_installation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.generation = NEW.generation
       AND OLD.os_installation_result = NEW.os_installation_result THEN
        RETURN NULL;
    END IF;
    IF NEW.os_installation_result = 'Success' AND EXISTS (
        SELECT 1 FROM machine_installation i
         WHERE i.machine_id = NEW.machine_id AND i.generation = NEW.generation AND i.reboot_by_bmc)
    THEN
        INSERT INTO machine_boot_request (machine_id, requested_at, requested_by, cause, reason)
        VALUES (NEW.machine_id, now(), 'shepherd', 'disk',
                'generation ' || NEW.generation || ' installed')
        ON CONFLICT (machine_id) DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
