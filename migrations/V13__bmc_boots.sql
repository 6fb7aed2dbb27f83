-- Machines shepherd boots into its live agent through their BMC
-- (CONTRACTS.md §5): which machines boot that way, which boots are asked
-- for and why, and whether a machine's agent came from such a boot.

-- The tag "boots through its BMC's virtual media" (inventory
-- `boot = "virtual-media"`), kept by the Provisioner from the inventory.
CREATE TABLE machine_bmc_boot (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    since timestamptz NOT NULL
);

-- "Boot this machine into the agent through its BMC": written when a
-- blank machine is listed ('enroll'), by an operator ('inspect'), by the
-- Recoverer's last step ('recovery') or by an installation asked of an
-- installed machine ('install'); the Enroller deletes it once the agent
-- called back. 'disk': restart it from its disk through its BMC, once its
-- agent reported an installation (so that BMCs that apply the media's
-- ejection only at a power cycle apply it).
CREATE TABLE machine_boot_request (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    requested_at timestamptz NOT NULL,
    requested_by text NOT NULL,
    cause text NOT NULL CHECK (cause IN ('enroll', 'inspect', 'recovery', 'install', 'disk')),
    reason text NULL
);

-- When the BMC took the boot (media inserted, machine reset), and when the
-- media was ejected and the override cleared.
ALTER TABLE machine_boot_credential
    ADD COLUMN media_inserted_at timestamptz NULL,
    ADD COLUMN media_ended_at timestamptz NULL;

ALTER TABLE operator_action DROP CONSTRAINT operator_action_action_check;
ALTER TABLE operator_action ADD CONSTRAINT operator_action_action_check
    CHECK (action IN ('retry', 'retakeover', 'reboot', 'hold', 'release', 'release-brake', 'install',
                      'inspect', 'accept-hardware'));

-- An operator accepted the differences between what the BMC says and what
-- the agent reported (a mismatch blocks installations until then).
CREATE TABLE machine_hardware_accepted (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- The differences accepted, as shown then; a new difference is not
    -- accepted by it.
    differences text NOT NULL,
    accepted_at timestamptz NOT NULL,
    accepted_by text NOT NULL
);

ALTER TABLE machine_summary
    ADD COLUMN bmc_boot boolean NOT NULL DEFAULT false,
    -- machine_boot_request.cause, NULL without one.
    ADD COLUMN boot_request text NULL,
    -- The machine runs the live agent (see machine_summary_live_agent).
    ADD COLUMN live_agent boolean NOT NULL DEFAULT false;

-- Machines to boot through their BMC, found without scanning the fleet.
CREATE INDEX machine_summary_bmc_boot ON machine_summary (provider, agent_start_not_before)
    WHERE bmc_boot;

CREATE FUNCTION machine_summary_on_bmc_boot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE machine_summary SET bmc_boot = false WHERE machine_id = OLD.machine_id;
    ELSE
        UPDATE machine_summary SET bmc_boot = true WHERE machine_id = NEW.machine_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_bmc_boot AFTER INSERT OR DELETE ON machine_bmc_boot
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_bmc_boot();

CREATE FUNCTION machine_summary_on_boot_request() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE machine_summary SET boot_request = NULL WHERE machine_id = OLD.machine_id;
    ELSE
        UPDATE machine_summary SET boot_request = NEW.cause WHERE machine_id = NEW.machine_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_boot_request AFTER INSERT OR UPDATE OR DELETE ON machine_boot_request
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_boot_request();

-- Whether the machine runs the live agent now: its agent key was enrolled
-- by a boot, after the last installation asked of it, and no installation
-- was reported since (an agent that installed a system rebooted into it).
CREATE FUNCTION machine_summary_live_agent(mid uuid) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE machine_summary SET live_agent = EXISTS (
        SELECT 1 FROM machine_agent_started a
          JOIN machine_boot_credential b
            ON b.machine_id = a.machine_id AND b.agent_public_key = a.agent_public_key
         WHERE a.machine_id = mid
           AND NOT EXISTS (SELECT 1 FROM machine_installation i
                            WHERE i.machine_id = mid AND i.requested_at >= a.agent_started_at))
     WHERE machine_id = mid;
END $$;
CREATE FUNCTION machine_summary_on_live_agent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM machine_summary_live_agent(OLD.machine_id);
    ELSE
        PERFORM machine_summary_live_agent(NEW.machine_id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_agent_key AFTER INSERT OR UPDATE OR DELETE ON machine_agent_started
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_live_agent();
CREATE TRIGGER machine_summary_live_agent_installation AFTER INSERT OR UPDATE OR DELETE ON machine_installation
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_live_agent();
CREATE FUNCTION machine_summary_on_installation_report() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE machine_summary SET live_agent = false WHERE machine_id = NEW.machine_id;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_live_agent_report AFTER INSERT OR UPDATE ON machine_os_installation_report
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_installation_report();

-- An installation of a machine booted through its BMC with a reboot asked:
-- its agent is asked not to reboot, and the BMC restarts it from its disk
-- once the installation is reported done.
ALTER TABLE machine_installation ADD COLUMN reboot_by_bmc boolean NOT NULL DEFAULT false;
CREATE FUNCTION machine_boot_after_installation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
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
CREATE TRIGGER machine_boot_after_installation AFTER INSERT OR UPDATE ON machine_os_installation_report
    FOR EACH ROW EXECUTE FUNCTION machine_boot_after_installation();
