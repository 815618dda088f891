//! Every choice the real resty.chash made, reproduced.

use lua_compat::chash::ChashRing;
use serde_json::Value;

#[test]
fn matches_every_recorded_resty_chash_choice() {
    let vectors: Value = serde_json::from_str(include_str!("fixtures/chash-vectors.json")).unwrap();
    assert_eq!(vectors["points_per_node"], 160);
    let mut checked = 0;
    for set in vectors["sets"].as_array().unwrap() {
        let nodes: Vec<&str> = set["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        let ring = ChashRing::new(nodes.iter().map(|n| (*n, 1)));
        for case in set["cases"].as_array().unwrap() {
            let key = case["key"].as_str().unwrap();
            let (node, _) = ring.find(key.as_bytes()).unwrap();
            assert_eq!(
                nodes[node],
                case["endpoint"].as_str().unwrap(),
                "key {key:?} over {nodes:?}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 14 * 250);
}
