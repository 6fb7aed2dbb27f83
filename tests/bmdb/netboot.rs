//! Full DHCP's leases (`mode = "dhcp"`) under a storm: many offers at once.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use shepherd::bmdb::netboot;
use shepherd::mac::MacAddr;
use shepherd_sim::testing::TestDb;

#[actix_rt::test]
async fn offers_made_at_once_each_get_an_address_of_their_own_until_the_pool_is_full() {
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let (first, last) = (Ipv4Addr::new(10, 9, 0, 1), Ipv4Addr::new(10, 9, 0, 40));
    let mac = |i: u8| -> MacAddr { format!("02:5e:00:00:00:{i:02x}").parse().unwrap() };
    // 40 machines' discovers at once (a rack powered on), on 16
    // connections, for a pool of 40: every one offered an address, no
    // two the same.
    let offers = futures::future::join_all((0..40u8).map(|i| {
        let bmdb = bmdb.clone();
        async move {
            bmdb.transact(async |tx| netboot::offer(tx, mac(i), first, last, None).await)
                .await
                .unwrap()
        }
    }))
    .await;
    let got: BTreeSet<Ipv4Addr> = offers
        .iter()
        .map(|o| o.expect("an offer while the pool has room"))
        .collect();
    assert_eq!(got.len(), 40, "{offers:?}");
    assert!(got.iter().all(|a| (first..=last).contains(a)), "{got:?}");
    // A machine asking again is offered its own address; a 41st, none.
    let again = bmdb
        .transact(async |tx| netboot::offer(tx, mac(7), first, last, None).await)
        .await
        .unwrap();
    assert_eq!(again, offers[7]);
    let full = bmdb
        .transact(async |tx| netboot::offer(tx, mac(200), first, last, None).await)
        .await
        .unwrap();
    assert_eq!(full, None);
}
