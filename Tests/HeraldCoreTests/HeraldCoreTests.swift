// HeraldCoreTests (to be written).
