// HeraldAPNsTests (to be written).
