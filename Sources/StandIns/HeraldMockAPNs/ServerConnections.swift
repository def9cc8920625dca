// The stand-in's connections: accepting them, the TLS handshake, reading into nghttp2 (a read budget per loop
// pass), writing what nghttp2 has ready (coalesced per pass), shutting down with GOAWAY and closing.
import CHeraldMockTLS
import CNghttp2
import Glibc

extension MockAPNsServer {
    func beginShutdown() {
        hmt_epoll_ctl(epollFD, 2, listenFD, 0)
        let reason = Array(#"{"reason":"Shutdown"}"#.utf8)
        for conn in connections.values {
            guard let session = conn.session else {
                closeConnection(conn, abort: false)
                continue
            }
            let last = nghttp2_session_get_last_proc_stream_id(session)
            if conn.goawayLastStreamID.map({ last < $0 }) ?? true { conn.goawayLastStreamID = last }
            reason.withUnsafeBufferPointer { r in
                _ = nghttp2_submit_goaway(
                    session, UInt8(NGHTTP2_FLAG_NONE.rawValue), last, NGHTTP2_NO_ERROR.rawValue,
                    r.baseAddress, r.count)
            }
            markDirty(conn)
        }
    }

    func acceptConnections() {
        while true {
            let fd = hmt_accept(listenFD, 1)
            if fd < 0 { return }
            guard let tls = hmt_conn_new(tlsContext, fd) else {
                Glibc.close(fd)
                continue
            }
            nextSerial += 1
            let conn = Connection(fd: fd, serial: nextSerial, server: self, tls: tls)
            connections[fd] = conn
            metrics.connectionsAccepted += 1
            metrics.connectionsOpen += 1
            addToEpoll(fd)
            handshake(conn)
        }
    }

    func handleEvents(_ conn: Connection, _ ev: Int32) {
        if conn.handshaking {
            handshake(conn)
            return
        }
        if ev & Int32(HMT_EV_IN | HMT_EV_HUP) != 0 {
            readAvailable(conn)
        }
        if !conn.closed && ev & Int32(HMT_EV_OUT) != 0 {
            markDirty(conn)
        }
    }

    func handshake(_ conn: Connection) {
        guard let tls = conn.tls else { return }
        let r = hmt_conn_handshake(tls)
        switch r {
        case Int32(HMT_OK):
            conn.handshaking = false
            guard hmt_conn_is_h2(tls) == 1 else {
                metrics.handshakeFailures += 1
                closeConnection(conn, abort: false)
                return
            }
            conn.certificateAuth = configuration.clientCAPath != nil && hmt_conn_peer_verified(tls) == 1
            if conn.certificateAuth {
                metrics.connectionsCertificateAuth += 1
            }
            let initial =
                conn.certificateAuth ? configuration.maxConcurrentStreams : configuration.initialConcurrentStreams
            guard conn.startSession(initialConcurrentStreams: initial) else {
                closeConnection(conn, abort: false)
                return
            }
            setWatchWritable(conn, false)
            markDirty(conn)
            readAvailable(conn)
        case Int32(HMT_WANT_READ):
            setWatchWritable(conn, false)
        case Int32(HMT_WANT_WRITE):
            setWatchWritable(conn, true)
        default:
            metrics.handshakeFailures += 1
            closeConnection(conn, abort: false)
        }
    }

    func readAvailable(_ conn: Connection) {
        guard let tls = conn.tls, let session = conn.session else { return }
        guard conn.readInPass != pass else { return }
        conn.readInPass = pass
        var taken = 0
        while !conn.closed {
            if taken >= Self.readBytesPerPass {
                // Budget spent: the rest waits for the next pass, after every other connection had its turn.
                if !conn.moreToRead {
                    conn.moreToRead = true
                    readAgain.append(conn)
                    metrics.readBudgetSpent += 1
                }
                break
            }
            let r = hmt_conn_read(tls, readBuffer, Int32(Self.readBufferSize))
            if r > 0 {
                taken += Int(r)
                let rv = nghttp2_session_mem_recv(session, readBuffer, Int(r))
                if rv < 0 {
                    conn.failed = true
                    break
                }
                if conn.resetRequested { break }
            } else if r == HMT_WANT_READ {
                break
            } else if r == HMT_WANT_WRITE {
                setWatchWritable(conn, true)
                break
            } else {
                // The peer closed or reset the connection: nothing more can be delivered.
                closeConnection(conn, abort: false)
                return
            }
        }
        if conn.resetRequested {
            flush(conn)
            metrics.resets += 1
            closeConnection(conn, abort: true)
            return
        }
        markDirty(conn)
    }

    func markDirty(_ conn: Connection) {
        guard !conn.inDirtyList, !conn.closed else { return }
        conn.inDirtyList = true
        dirty.append(conn)
    }

    func flushDirty() {
        guard !dirty.isEmpty else { return }
        let list = dirty
        dirty.removeAll(keepingCapacity: true)
        for conn in list {
            conn.inDirtyList = false
            flush(conn)
        }
    }

    /// Takes every frame nghttp2 has ready and writes the lot with as few SSL_write calls as
    /// possible (one per 16 KB record); closes the connection when the session is finished.
    func flush(_ conn: Connection) {
        guard !conn.closed, let session = conn.session, let tls = conn.tls else { return }
        if conn.failed {
            closeConnection(conn, abort: false)
            return
        }
        while conn.pendingOutput < (1 << 20) {
            var p: UnsafePointer<UInt8>?
            let n = nghttp2_session_mem_send(session, &p)
            if n < 0 {
                closeConnection(conn, abort: false)
                return
            }
            guard n > 0, let p else {
                let before = conn.advertisedStreams
                if conn.submitScheduledMaxConcurrentStreams() {
                    if conn.advertisedStreams > before {
                        metrics.streamLimitRaises += 1
                    } else {
                        metrics.streamLimitLowerings += 1
                    }
                    continue
                }
                break
            }
            conn.appendOutput(p, n)
        }
        while conn.outStart < conn.outEnd {
            let len = Int32(min(conn.outEnd - conn.outStart, Int(Int32.max)))
            let r = hmt_conn_write(tls, conn.out + conn.outStart, len)
            if r > 0 {
                conn.outStart += Int(r)
            } else if r == HMT_WANT_WRITE || r == HMT_WANT_READ {
                setWatchWritable(conn, true)
                return
            } else {
                closeConnection(conn, abort: false)
                return
            }
        }
        conn.outStart = 0
        conn.outEnd = 0
        setWatchWritable(conn, false)
        if nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0 {
            closeConnection(conn, abort: false)
        }
    }

    func setWatchWritable(_ conn: Connection, _ on: Bool) {
        guard conn.watchingWritable != on, !conn.closed else { return }
        conn.watchingWritable = on
        hmt_epoll_ctl(epollFD, 1, conn.fd, Int32(on ? (HMT_EV_IN | HMT_EV_OUT) : HMT_EV_IN))
    }

    func closeConnection(_ conn: Connection, abort: Bool) {
        guard !conn.closed else { return }
        conn.closed = true
        hmt_epoll_ctl(epollFD, 2, conn.fd, 0)
        if abort {
            // SO_LINGER 0: close sends a TCP RST, like a connection lost mid-flight.
            var lg = linger(l_onoff: 1, l_linger: 0)
            setsockopt(conn.fd, SOL_SOCKET, SO_LINGER, &lg, socklen_t(MemoryLayout<linger>.size))
        }
        Glibc.close(conn.fd)
        connections.removeValue(forKey: conn.fd)
        metrics.connectionsOpen -= 1
    }
}
