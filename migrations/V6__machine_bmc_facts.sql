-- What an inventory host's BMC says about it (Redfish ComputerSystem), read
-- by the Updater each round and written only when something changed. Not a
-- contract table: shepherd's own, beside them.
CREATE TABLE machine_bmc_facts (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- The BMC and the system's @odata.id.
    bmc_url text NOT NULL,
    system_path text NULL,
    -- Redfish PowerState: On, Off, PoweringOn, PoweringOff, Paused.
    power_state text NULL,
    manufacturer text NULL,
    model text NULL,
    serial_number text NULL,
    bios_version text NULL,
    processor_count integer NULL,
    processor_model text NULL,
    memory_gib double precision NULL,
    -- Status.Health: OK, Warning, Critical.
    health text NULL,
    -- Why the last read failed (the facts above are from the read before).
    read_error text NULL,
    -- When any of the above last changed.
    changed_at timestamptz NOT NULL DEFAULT now()
);
