import HeraldCore
import HeraldPipeline
import HeraldPushProviders

/// A provider client herald-send keeps one of per credential (APNs, FCM).
package protocol CredentialClient: AnyObject, BatchPushClient {
    func shutdown(grace: Duration) async
}

/// Sends each client's share of a stage's batch (the indices of its jobs in `jobs`), all clients at once, and
/// reports every answer under the index of its job in the batch: `delivery` makes a client request from a job's
/// rendered request (deadline, tag), `answer` reads the provider's answer; `onRetry` gets a traced request's
/// retries by its client.
func sendConcurrently<Client: CredentialClient>(
    _ jobs: [PushJob], _ shares: [(Client, [Int])], timeout: Duration,
    delivery: @escaping @Sendable (PushRequest, Duration, UInt64) -> PushDelivery,
    answer: @escaping @Sendable (PushResponse) -> PushAnswer,
    onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void,
    onRetry: @escaping @Sendable (Int, ProviderRetry) -> Void = { _, _ in }
) async {
    await withTaskGroup(of: Void.self) { group in
        for (client, indices) in shares {
            group.addTask {
                let requests = indices.map { index in
                    var request = delivery(jobs[index].request, timeout, UInt64(index))
                    request.prioritized = jobs[index].prioritized
                    if jobs[index].traced { request.traced = true }
                    return request
                }
                await client.answers(for: requests) { response in
                    // A traced request's retries by the client (none for the others), before its answer.
                    for retry in response.retries { onRetry(Int(response.tag), retry) }
                    onAnswer(Int(response.tag), answer(response))
                }
            }
        }
    }
}

extension APNsClient: CredentialClient {}
extension FCMClient: CredentialClient {}

/// One provider's clients, one per credential key, each with the fingerprint of what it was made from (the
/// credential's settings and its files' bytes): a reload keeps the client of an unchanged credential, so its
/// connections stay up, and makes new clients only for new and changed credentials.
package struct CredentialClients<Key: Hashable & Sendable, Client: CredentialClient>: Sendable {
    package private(set) var clients: [Key: Client] = [:]
    private var fingerprints: [Key: [UInt8]] = [:]

    package init() {}

    /// A client for every credential (the first of a key wins); one that cannot be made is handed to `unusable`
    /// and left out, so its notifications are dead-lettered with `no_credential`.
    package init<Credential>(
        _ credentials: [(Key, String, Credential)], fingerprint: (Credential) -> [UInt8],
        make: (String, Credential) throws -> Client, unusable: (String, Credential, any Error) -> Void
    ) {
        for (key, appID, credential) in credentials where clients[key] == nil {
            do {
                clients[key] = try make(appID, credential)
                fingerprints[key] = fingerprint(credential)
            } catch {
                unusable(appID, credential, error)
            }
        }
    }

    /// The clients for a reloaded pipeline file, and the ones that had to be made: an unchanged credential keeps
    /// its client from `self`. Throws when a credential cannot be made, after closing the clients made so far, so
    /// a bad file never takes a working credential away.
    package func reloaded<Credential>(
        _ credentials: [(Key, String, Credential)], fingerprint: (Credential) -> [UInt8],
        make: (String, Credential) throws -> Client
    ) throws -> (clients: CredentialClients, created: [Client]) {
        var next = CredentialClients()
        var created: [Client] = []
        do {
            for (key, appID, credential) in credentials where next.clients[key] == nil {
                let print = fingerprint(credential)
                if let existing = clients[key], fingerprints[key] == print {
                    next.clients[key] = existing
                } else {
                    let client = try make(appID, credential)
                    created.append(client)
                    next.clients[key] = client
                }
                next.fingerprints[key] = print
            }
        } catch {
            for client in created { Task { await client.shutdown(grace: .zero) } }
            throw error
        }
        return (next, created)
    }

    /// The clients of `self` that `next` no longer holds (to be closed once their requests are answered).
    package func retired(by next: CredentialClients) -> [Client] {
        let kept = Set(next.clients.values.map(ObjectIdentifier.init))
        return clients.values.filter { !kept.contains(ObjectIdentifier($0)) }
    }
}
