// HeraldRedisTests (to be written).
