-- The firmware a machine runs, as its BMC lists it (redfish::firmware),
-- read by the Updater: the system's BIOS (`bios`), the BMC's own (`bmc`),
-- network adapters' (`nic:<Id>`) and the UpdateService's inventory
-- (`inventory:<Id>`). Not a contract table: shepherd's own.
CREATE TABLE machine_firmware (
    machine_id uuid NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    component text NOT NULL,
    -- What the BMC calls it (Name), when it says.
    name text NULL,
    version text NOT NULL,
    -- Whether the BMC says it can update it (Updateable), when it says.
    updateable boolean NULL,
    -- When this version was first seen.
    since timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (machine_id, component)
);

-- Every version a component was seen at, the first one too.
CREATE TABLE machine_firmware_history (
    machine_id uuid NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    component text NOT NULL,
    version text NOT NULL,
    -- NULL: the component's first version seen.
    previous text NULL,
    seen_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX machine_firmware_history_machine ON machine_firmware_history (machine_id, seen_at);

-- The system's BIOS settings as the BMC lists them (its Bios resource's
-- Attributes), with the attribute registry that names them.
CREATE TABLE machine_bios (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    registry text NULL,
    attributes jsonb NOT NULL,
    -- When they last changed.
    changed_at timestamptz NOT NULL DEFAULT now()
);

-- The system's storage as the BMC lists it (its Storage resources): each
-- with its drives and volumes (RAID), as JSON (bmdb::firmware::Storage).
CREATE TABLE machine_storage (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    storage jsonb NOT NULL,
    -- When it last changed.
    changed_at timestamptz NOT NULL DEFAULT now()
);

-- When a machine's firmware was last read, and why that read failed (the
-- components above are then from the read before).
CREATE TABLE machine_firmware_read (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    read_at timestamptz NOT NULL DEFAULT now(),
    read_error text NULL
);
