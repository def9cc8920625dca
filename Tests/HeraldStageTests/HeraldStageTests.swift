// HeraldStageTests (to be written).
