// What herald-mock-fcm checks on messages:send, row by row (the same checks FCM makes).

import Foundation
import HeraldCore
import HeraldPushProviders
import Testing

@testable import HeraldMockProviders

@Suite("FCM stand-in checks")
struct StandInCheckTests {
    struct Row: CustomTestStringConvertible, Sendable {
        let name: String
        let auth: String?
        let path: String?
        let body: String
        let status: Int
        let reason: String
        var testDescription: String { name }
    }

    static let token = regToken(3)
    static let valid =
        #"{"message":{"token":"\#(token)","notification":{"title":"A","body":"B"},"data":{"k":"v"},"android":{"priority":"high","ttl":"60s"}}}"#

    static let rows: [Row] = [
        Row(name: "valid message", auth: "good", path: nil, body: valid, status: 200, reason: ""),
        Row(name: "no access token", auth: nil, path: nil, body: valid, status: 401, reason: "UNAUTHENTICATED"),
        Row(
            name: "expired access token", auth: "expired", path: nil, body: valid, status: 401,
            reason: "UNAUTHENTICATED"),
        Row(
            name: "unknown access token", auth: "Bearer ya29.forged", path: nil, body: valid, status: 401,
            reason: "UNAUTHENTICATED"),
        Row(
            name: "token of another project", auth: "foreign", path: nil, body: valid, status: 403,
            reason: "PERMISSION_DENIED"),
        Row(
            name: "non-string data value", auth: "good", path: nil,
            body: #"{"message":{"token":"\#(token)","data":{"n":1}}}"#, status: 400, reason: "INVALID_ARGUMENT"),
        Row(
            name: "no token", auth: "good", path: nil, body: #"{"message":{"data":{"k":"v"}}}"#, status: 400,
            reason: "INVALID_ARGUMENT"),
        Row(
            name: "malformed token", auth: "good", path: nil, body: #"{"message":{"token":"a b"}}"#, status: 400,
            reason: "INVALID_ARGUMENT"),
        Row(
            name: "unknown field", auth: "good", path: nil, body: #"{"message":{"token":"\#(token)","badge":1}}"#,
            status: 400,
            reason: "INVALID_ARGUMENT"),
        Row(
            name: "bad android priority", auth: "good", path: nil,
            body: #"{"message":{"token":"\#(token)","android":{"priority":"urgent"}}}"#, status: 400,
            reason: "INVALID_ARGUMENT"),
        Row(
            name: "bad ttl", auth: "good", path: nil,
            body: #"{"message":{"token":"\#(token)","android":{"ttl":"1 day"}}}"#,
            status: 400, reason: "INVALID_ARGUMENT"),
        Row(
            name: "payload over 4096 bytes", auth: "good", path: nil,
            body: #"{"message":{"token":"\#(token)","data":{"k":"\#(String(repeating: "x", count: 4100))"}}}"#,
            status: 400,
            reason: "INVALID_ARGUMENT"),
        Row(name: "not JSON", auth: "good", path: nil, body: "{", status: 400, reason: "INVALID_ARGUMENT"),
        Row(
            name: "wrong path", auth: "good", path: "/v1/projects/herald-test-project/messages:get", body: valid,
            status: 404,
            reason: "NOT_FOUND"),
    ]

    @Test("messages:send validates authentication and the message schema", arguments: rows)
    func check(_ row: Row) throws {
        let pki = try ProviderPKI()
        let server = try MockProvidersServer(
            configuration: MockProvidersConfiguration(
                certificatePath: pki.cert, privateKeyPath: pki.key, projectID: pki.project,
                clientEmail: pki.clientEmail,
                servicePublicKeyPath: pki.serviceKey))
        let auth: String?
        switch row.auth {
        case "good": auth = "Bearer " + server.issueToken(project: pki.project)
        case "expired": auth = "Bearer " + server.issueToken(project: pki.project, lifetime: -1)
        case "foreign": auth = "Bearer " + server.issueToken(project: "someone-else")
        default: auth = row.auth
        }
        let answer = server.sendAnswer(
            path: row.path ?? "/v1/projects/\(pki.project)/messages:send", authorization: auth,
            body: Array(row.body.utf8))
        #expect(answer.0 == row.status)
        #expect(answer.2 == row.reason)
        if row.status != 200 {
            let body = FCMErrorBody.parse(Array(answer.1.utf8))
            #expect(body != nil, "not an FCM error body: \(answer.1)")
        }
    }

    @Test("the service account's description and key errors never contain the private key")
    func privateKeyNeverShown() throws {
        let pki = try ProviderPKI()
        let account = try pki.serviceAccount(port: 1)
        let pem = try String(contentsOfFile: pki.serviceKey, encoding: .utf8)
        let keyLine = try #require(pem.split(separator: "\n").dropFirst().first.map(String.init))
        #expect(!"\(account)".contains(keyLine))
        let broken = FCMServiceAccount(
            projectID: "p", clientEmail: "e", privateKeyID: nil, tokenURI: "https://x/token",
            privateKeyPEM: pem.replacingOccurrences(of: keyLine, with: String(keyLine.reversed())))
        do {
            _ = try FCMAssertion(account: broken)
            Issue.record("a broken key was accepted")
        } catch {
            #expect(!"\(error)".contains(String(keyLine.reversed())) && !"\(error)".contains(keyLine))
        }
    }
}
