// HeraldMockAPNsTests
