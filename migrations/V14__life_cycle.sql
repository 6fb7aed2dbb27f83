-- The machine's life cycle closes (issue 31): deprovisioning erases its
-- disks through its agent and leaves it available; installations carry
-- first-boot data. An erasure is a generation of the machine's
-- installation request like any other (the agent answers it with the same
-- report and shows its progress the same way): `machine_installation.kind`
-- says which it is, and the summary's `installation` says cleaning,
-- available or clean-failed for an erasure.

ALTER TABLE machine_installation
    ADD COLUMN kind text NOT NULL DEFAULT 'install' CHECK (kind IN ('install', 'erase')),
    -- An erasure's mode (metadata, discard, secure, overwrite).
    ADD COLUMN erase_mode text NULL,
    -- What first-boot data the installation carries, as shown: the volume
    -- and each file's name, size and SHA-256 (never the files: user-data
    -- holds secrets).
    ADD COLUMN first_boot text NULL;

-- Erasures are history too.
ALTER TABLE installation_history DROP CONSTRAINT installation_history_event_check;
ALTER TABLE installation_history ADD CONSTRAINT installation_history_event_check
    CHECK (event IN ('requested', 'installed', 'failed', 'erase-requested', 'erased', 'erase-failed'));

CREATE OR REPLACE FUNCTION installation_history_on_report() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    erase boolean;
BEGIN
    IF TG_OP = 'INSERT' OR OLD.generation IS DISTINCT FROM NEW.generation
       OR OLD.os_installation_result IS DISTINCT FROM NEW.os_installation_result THEN
        erase := EXISTS (SELECT 1 FROM machine_installation i
                          WHERE i.machine_id = NEW.machine_id AND i.generation = NEW.generation
                            AND i.kind = 'erase');
        INSERT INTO installation_history (machine_id, generation, event, "timestamp")
        VALUES (NEW.machine_id, NEW.generation,
                CASE WHEN NEW.os_installation_result = 'Success' AND erase THEN 'erased'
                     WHEN NEW.os_installation_result = 'Success' THEN 'installed'
                     WHEN erase THEN 'erase-failed'
                     ELSE 'failed' END,
                now());
    END IF;
    RETURN NULL;
END $$;

-- installing / installed / install-failed for an installation; cleaning /
-- available / clean-failed for an erasure.
CREATE OR REPLACE FUNCTION machine_summary_installation(mid uuid) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE machine_summary s SET
        installation_fulfilled = COALESCE(i.fulfilled, false),
        installation = i.state
      FROM (SELECT bool_or(rq.generation = rp.generation) AS fulfilled,
                   max(CASE WHEN rq.machine_id IS NULL THEN NULL
                            WHEN rq.generation IS DISTINCT FROM rp.generation THEN
                                 CASE WHEN mi.kind = 'erase' THEN 'cleaning' ELSE 'installing' END
                            WHEN rp.os_installation_result = 'Success' THEN
                                 CASE WHEN mi.kind = 'erase' THEN 'available' ELSE 'installed' END
                            WHEN mi.kind = 'erase' THEN 'clean-failed'
                            ELSE 'install-failed' END) AS state
              FROM (SELECT mid AS machine_id) x
              LEFT JOIN machine_os_installation_request rq ON rq.machine_id = x.machine_id
              LEFT JOIN machine_os_installation_report rp ON rp.machine_id = x.machine_id
              LEFT JOIN machine_installation mi
                     ON mi.machine_id = x.machine_id AND mi.generation = rq.generation) i
     WHERE s.machine_id = mid;
END $$;

-- The kind is written beside the request, in the same transaction: the
-- summary follows either.
CREATE FUNCTION machine_summary_on_installation_kind() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM machine_summary_installation(NEW.machine_id);
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_installation_kind
    AFTER INSERT OR UPDATE OF generation, kind ON machine_installation
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_installation_kind();

-- The live agent stays live through an erasure (it erases and stays): only
-- installations count against it.
CREATE OR REPLACE FUNCTION machine_summary_live_agent(mid uuid) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE machine_summary SET live_agent = EXISTS (
        SELECT 1 FROM machine_agent_started a
          JOIN machine_boot_credential b
            ON b.machine_id = a.machine_id AND b.agent_public_key = a.agent_public_key
         WHERE a.machine_id = mid
           AND NOT EXISTS (SELECT 1 FROM machine_installation i
                            WHERE i.machine_id = mid AND i.kind = 'install'
                              AND i.requested_at >= a.agent_started_at))
     WHERE machine_id = mid;
END $$;
CREATE OR REPLACE FUNCTION machine_summary_on_installation_report() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM machine_installation i
                    WHERE i.machine_id = NEW.machine_id AND i.generation = NEW.generation
                      AND i.kind = 'erase') THEN
        UPDATE machine_summary SET live_agent = false WHERE machine_id = NEW.machine_id;
    END IF;
    RETURN NULL;
END $$;

-- A deprovisioning of an installed machine booted through its BMC boots
-- it into the live agent first.
ALTER TABLE machine_boot_request DROP CONSTRAINT machine_boot_request_cause_check;
ALTER TABLE machine_boot_request ADD CONSTRAINT machine_boot_request_cause_check
    CHECK (cause IN ('enroll', 'inspect', 'recovery', 'install', 'disk', 'deprovision'));

ALTER TABLE operator_action DROP CONSTRAINT operator_action_action_check;
ALTER TABLE operator_action ADD CONSTRAINT operator_action_action_check
    CHECK (action IN ('retry', 'retakeover', 'reboot', 'hold', 'release', 'release-brake', 'install',
                      'inspect', 'accept-hardware', 'deprovision'));

-- A rollout may deprovision instead of install: its erasure's bytes
-- (`DiskErasure`), asked of each machine in turn.
ALTER TABLE rollout ADD COLUMN erasure_raw bytea NULL;
