// HeraldKafkaTests (to be written).
