-- Machines that enlist themselves (CONTRACTS.md §6, `netboot.discover`):
-- an unknown MAC that boots the provisioning network gets the live agent
-- with a discovery boot and becomes a machine in state `discovered`;
-- nothing is installed on or erased from it until an operator accepts it
-- with its BMC, which makes it an inventory machine like any other.

-- One row per machine that enlisted itself. `accepted_at` NULL, or its
-- erasure pending: still `discovered` (no control loop works on it).
CREATE TABLE machine_discovered (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- The provisioning NIC it booted from (also its `machine_boot_mac`).
    mac macaddr NOT NULL UNIQUE,
    -- What its PXE client said it is (DHCP option 93): 'bios' or 'uefi'.
    firmware text NOT NULL CHECK (firmware IN ('bios', 'uefi')),
    discovered_at timestamptz NOT NULL,
    -- Its latest discovery boot, and how many it was given.
    last_boot_at timestamptz NOT NULL,
    boots integer NOT NULL DEFAULT 1,
    accepted_at timestamptz NULL,
    accepted_by text NULL,
    -- Accepted, its disks not yet asked erased: that waits for its BMC's
    -- facts, checked against its agent's report (the Updater asks it);
    -- until then it stays `discovered`. Why the last ask was refused.
    erase_pending boolean NOT NULL DEFAULT false,
    erase_refused text NULL
);

-- An accepted machine's BMC, as the inventory lists it: the static
-- inventory provider lists these beside its configured hosts. The password
-- is kept here (every shepherd sharing the BMDB drives the BMC), never
-- shown by the API, the pages or the logs.
CREATE TABLE machine_accepted_bmc (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- Its inventory host ID (machine_provided.provider_id).
    host_id text NOT NULL UNIQUE,
    url text NOT NULL,
    username text NOT NULL,
    password text NOT NULL,
    -- The Redfish ComputerSystem (NULL: the BMC's only one).
    system text NULL,
    -- 'verify', 'insecure', or a CA file's path.
    tls text NOT NULL DEFAULT 'verify',
    accepted_at timestamptz NOT NULL
);

ALTER TABLE machine_summary ADD COLUMN discovered boolean NOT NULL DEFAULT false;

CREATE FUNCTION machine_summary_on_discovered() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE machine_summary SET discovered = false WHERE machine_id = OLD.machine_id;
    ELSE
        UPDATE machine_summary SET discovered = (NEW.accepted_at IS NULL OR NEW.erase_pending)
         WHERE machine_id = NEW.machine_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_summary_discovered
    AFTER INSERT OR DELETE OR UPDATE OF accepted_at, erase_pending ON machine_discovered
    FOR EACH ROW EXECUTE FUNCTION machine_summary_on_discovered();

ALTER TABLE operator_action DROP CONSTRAINT operator_action_action_check;
ALTER TABLE operator_action ADD CONSTRAINT operator_action_action_check
    CHECK (action IN ('retry', 'retakeover', 'reboot', 'hold', 'release', 'release-brake', 'install',
                      'inspect', 'accept-hardware', 'deprovision', 'accept'));
