-- Secure Boot as a machine's BMC says (Redfish's SecureBoot resource of
-- its ComputerSystem), read by the Updater with the other facts. NULL:
-- not read (an IPMI BMC, or a BMC without the resource).
ALTER TABLE machine_bmc_facts
    ADD COLUMN secure_boot_enable boolean NULL,
    -- SecureBootCurrentBoot: Enabled, Disabled (this boot's state).
    ADD COLUMN secure_boot_current_boot text NULL,
    -- SecureBootMode: SetupMode, UserMode, AuditMode, DeployedMode.
    ADD COLUMN secure_boot_mode text NULL;
