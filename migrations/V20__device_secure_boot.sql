-- Secure Boot as a device's plan asks (metal.plans[].secure_boot), set
-- through the machine's BMC before it restarts into the tenant's system.
-- NULL: as the host's configuration says (bmc.secure_boot), else as it is.
ALTER TABLE device ADD COLUMN secure_boot boolean NULL;
