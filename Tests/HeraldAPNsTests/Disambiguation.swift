// HeraldCore and HeraldAPNs both declare APNsCredential, APNsRequest and APNsEnvironment; these tests mean the
// transport's. (Added when main's merge of core + apns stopped compiling; remove once the names are unique.)
import HeraldAPNs

typealias APNsCredential = HeraldAPNs.APNsCredential
typealias APNsRequest = HeraldAPNs.APNsRequest
typealias APNsEnvironment = HeraldAPNs.APNsEnvironment
