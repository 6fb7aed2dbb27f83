"""Every response shape equinix-sim serves, read by Equinix's own Python SDK.

The SDK (`equinix` on PyPI, module `equinix.services.metalv1`; 0.19.0 is the
last release that carries it) deserializes each response into its pydantic
models and raises on anything its models reject: a missing required field,
a wrong type, an enum value it does not know. This script drives every
operation shepherd uses, the way an SDK user would, and prints one verdict
line per response shape. Exit status 0 only if every shape passed.

Usage: metal_sdk_check.py API_URL PROJECT_ID TOKEN
"""

import sys
import traceback

import equinix.services.metalv1 as metal
from equinix.services.metalv1.exceptions import ApiException


def main():
    api_url, project_id, token = sys.argv[1:4]
    cfg = metal.Configuration(host=api_url)
    cfg.api_key["x_auth_token"] = token
    client = metal.ApiClient(cfg)
    devices = metal.DevicesApi(client)
    reservations = metal.HardwareReservationsApi(client)
    keys = metal.SSHKeysApi(client)
    results = []

    def check(shape, fn):
        try:
            detail = fn()
            results.append((shape, True, detail or ""))
        except Exception as e:  # the verdict is the exception
            results.append((shape, False, f"{type(e).__name__}: {e}".replace("\n", " ")[:600]))
            traceback.print_exc(file=sys.stderr)

    state = {}

    def list_reservations():
        page = reservations.find_project_hardware_reservations(project_id, per_page=3)
        assert isinstance(page, metal.HardwareReservationList)
        assert page.meta is not None and page.meta.total is not None
        every = []
        p = 1
        while True:
            r = reservations.find_project_hardware_reservations(project_id, page=p, per_page=3)
            every.extend(r.hardware_reservations)
            if r.meta.next is None:
                break
            p += 1
        assert len(every) == page.meta.total, (len(every), page.meta.total)
        state["reservations"] = every
        return f"{len(every)} reservations over {p} pages"

    def ssh_keys():
        created = keys.create_project_ssh_key(
            project_id,
            metal.SSHKeyCreateInput(label="sdk-check", key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG9vZm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9v sdk"),
        )
        assert isinstance(created, metal.SSHKey) and created.id
        listed = keys.find_project_ssh_keys(project_id)
        assert isinstance(listed, metal.SSHKeyList)
        assert any(k.id == created.id for k in listed.ssh_keys)
        updated = keys.update_ssh_key(created.id, metal.SSHKeyInput(label="sdk-check-2"))
        assert updated.label == "sdk-check-2"
        state["key"] = created.id
        return f"created, listed ({len(listed.ssh_keys)}), updated"

    def create_device():
        free = [r for r in state["reservations"] if r.device is None and r.provisionable]
        assert free, "no free reservation"
        r = free[0]
        req = metal.CreateDeviceRequest(
            metal.DeviceCreateInMetroInput(
                metro=metal.MetroInputMetro("sv"),
                hostname="shepherd-sdk-check",
                plan=(r.plan.slug if r.plan and r.plan.slug else "c3.small.x86"),
                operating_system="ubuntu_22_04",
                hardware_reservation_id=r.id,
                project_ssh_keys=[state["key"]],
                tags=["shepherd", "sdk"],
            )
        )
        d = devices.create_device(project_id, req)
        assert isinstance(d, metal.Device) and d.id
        state["device"] = d.id
        state["reservation"] = r.id
        return f"device {d.id} state {d.state}"

    def get_device():
        d = devices.find_device_by_id(state["device"])
        assert d.id == state["device"]
        assert d.hardware_reservation is not None
        return f"state {d.state}, {len(d.ip_addresses or [])} addresses"

    def device_addresses():
        import time
        deadline = time.time() + 20
        while True:
            d = devices.find_device_by_id(state["device"])
            if d.state == "active":
                break
            assert time.time() < deadline, f"device not active: {d.state}"
            time.sleep(0.2)
        assert d.ip_addresses, "an active device has addresses"
        for ip in d.ip_addresses:
            assert ip.address and ip.assigned_to is not None
        return f"active with {len(d.ip_addresses)} addresses, each with assigned_to"

    def list_devices():
        page = devices.find_project_devices(project_id, per_page=1)
        assert isinstance(page, metal.DeviceList)
        assert any(True for _ in page.devices)
        assert page.meta is not None
        return f"{page.meta.total} devices"

    def get_reservation():
        r = reservations.find_hardware_reservation_by_id(state["reservation"], include=["device"])
        assert isinstance(r, metal.HardwareReservation)
        assert r.device is not None and r.device.id == state["device"]
        return "with its device"

    def reboot():
        import time
        devices.perform_action(state["device"], metal.DeviceActionInput(type="reboot"))
        # Every state the device passes through on the way back reads.
        seen = []
        deadline = time.time() + 20
        while time.time() < deadline:
            d = devices.find_device_by_id(state["device"])
            if not seen or seen[-1] != d.state:
                seen.append(d.state)
            if d.state == "active" and len(seen) > 1:
                break
            time.sleep(0.05)
        assert seen[-1] == "active", seen
        return "accepted; states " + " -> ".join(seen)

    def not_found():
        try:
            devices.find_device_by_id("00000000-0000-4000-8000-000000000000")
        except metal.exceptions.NotFoundException as e:
            assert e.status == 404
            return "NotFoundException"
        raise AssertionError("a missing device did not raise")

    def unauthorized():
        bad = metal.Configuration(host=api_url)
        bad.api_key["x_auth_token"] = "wrong-token"
        try:
            metal.DevicesApi(metal.ApiClient(bad)).find_project_devices(project_id)
        except metal.exceptions.UnauthorizedException as e:
            assert e.status == 401
            return "UnauthorizedException"
        raise AssertionError("a wrong token did not raise")

    def unprocessable():
        req = metal.CreateDeviceRequest(
            metal.DeviceCreateInMetroInput(
                metro=metal.MetroInputMetro("sv"),
                hostname="shepherd-sdk-check-2",
                plan="c3.small.x86",
                operating_system="ubuntu_22_04",
                hardware_reservation_id=state["reservation"],
            )
        )
        try:
            devices.create_device(project_id, req)
        except ApiException as e:
            assert e.status == 422, e.status
            return "422 for a reservation in use"
        raise AssertionError("a second device on one reservation did not raise")

    def faults(body):
        import json
        import urllib.request
        base = api_url.split("/metal/v1")[0]
        req = urllib.request.Request(
            base + "/_sim/faults",
            data=json.dumps(body).encode(),
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(req).read()

    def injected(status, body):
        faults(dict({"latency": "0s", "error_rate": 0.0, "rate_limit_rate": 0.0,
                     "retry_after_secs": 1, "lost_rate": 0.0}, **body))
        try:
            devices.find_project_devices(project_id)
        except ApiException as e:
            assert e.status == status, e.status
            return f"{type(e).__name__}, body {e.body!r}"
        finally:
            faults({"latency": "0s", "error_rate": 0.0, "rate_limit_rate": 0.0,
                    "retry_after_secs": 1, "lost_rate": 0.0})
        raise AssertionError(f"no {status}")

    def delete_device():
        devices.delete_device(state["device"])
        try:
            devices.find_device_by_id(state["device"])
        except metal.exceptions.NotFoundException:
            return "deleted, then 404"
        return "deleted (still listed while deprovisioning)"

    check("HardwareReservationList (GET /projects/{id}/hardware-reservations)", list_reservations)
    check("SSHKey, SSHKeyList (POST/GET /projects/{id}/ssh-keys, PUT /ssh-keys/{id})", ssh_keys)
    check("Device (POST /projects/{id}/devices)", create_device)
    check("Device (GET /devices/{id})", get_device)
    check("Device.ip_addresses[] IPAssignment (active device)", device_addresses)
    check("DeviceList (GET /projects/{id}/devices)", list_devices)
    check("HardwareReservation (GET /hardware-reservations/{id}?include=device)", get_reservation)
    check("POST /devices/{id}/actions reboot", reboot)
    check("Error 404", not_found)
    check("Error 401", unauthorized)
    check("Error 422", unprocessable)
    check("Error 503 (injected)", lambda: injected(503, {"error_rate": 1.0}))
    check("Error 429 with Retry-After (injected)", lambda: injected(429, {"rate_limit_rate": 1.0}))
    check("DELETE /devices/{id}", delete_device)

    width = max(len(s) for s, _, _ in results)
    for shape, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {shape:<{width}}  {detail}")
    failed = sum(1 for _, ok, _ in results if not ok)
    print(f"{len(results) - failed} of {len(results)} response shapes accepted by the SDK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
