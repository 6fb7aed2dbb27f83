-- SSH host keys recorded on first contact (ssh.host_keys = "accept-new").
-- A tag like the others: delete the row to accept a machine's new key (after
-- a reinstall, say).
CREATE TABLE machine_ssh_host_key (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- OpenSSH public key line: "ssh-ed25519 AAAA…".
    host_key text NOT NULL,
    first_seen_at timestamptz NOT NULL
);
