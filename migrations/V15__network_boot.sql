-- Machines booted from the provisioning network (CONTRACTS.md §6): how a
-- machine booted through its BMC boots, the MACs the network boot service
-- answers, and the addresses it hands out in mode = "dhcp".

-- 'virtual-media' (a virtual CD) or 'network' (PXE, then iPXE), as the
-- inventory lists it; kept by the Provisioner with the tag itself.
ALTER TABLE machine_bmc_boot
    ADD COLUMN via text NOT NULL DEFAULT 'virtual-media'
        CHECK (via IN ('virtual-media', 'network'));

-- The provisioning NICs of machines that boot the network: the network
-- boot service answers a PXE client only when its MAC is here and its
-- machine has a boot issued. One MAC is one machine's.
CREATE TABLE machine_boot_mac (
    mac macaddr PRIMARY KEY,
    machine_id uuid NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE
);
CREATE INDEX machine_boot_mac_machine ON machine_boot_mac (machine_id);

-- mode = "dhcp": the addresses handed out. The address is the key, so
-- that several shepherds on one provisioning network never hand out one
-- address twice; a MAC holds at most one. An offer holds its address for
-- a short while (offered), a request grants it for the lease.
CREATE TABLE netboot_lease (
    address inet PRIMARY KEY,
    mac macaddr NOT NULL UNIQUE,
    expires_at timestamptz NOT NULL,
    granted boolean NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX netboot_lease_expires ON netboot_lease (expires_at);

-- Virtual media with a per-boot user name and password (derived from the
-- boot's credential): the image server asks a boot's fetcher for them
-- when set, so knowing the URL no longer lets anyone race the machine's
-- agent; a BMC that refuses them gets the open URL (this flag off).
ALTER TABLE machine_boot_credential ADD COLUMN media_auth boolean NOT NULL DEFAULT false;
