-- Boots of machines into shepherd's boot image through their BMC
-- (CONTRACTS.md §5). Each boot has a credential, carried in that boot's
-- copy of the image (served at /boot/<boot_id>.iso until it is used or
-- expires): good for one enrollment of this machine's live agent, whose
-- key then becomes the machine's agent key.
CREATE TABLE machine_boot_credential (
    boot_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    machine_id uuid NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    credential bytea NOT NULL,
    issued_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    -- Set once, by the enrollment that used it, with the key it enrolled.
    used_at timestamptz NULL,
    agent_public_key bytea NULL
);
CREATE INDEX machine_boot_credential_machine ON machine_boot_credential (machine_id, issued_at);
