#pragma once
// hiredis 1.x (RESP2 is spoken: Herald never sends HELLO 3) and its TLS layer (redisInitiateSSL).
#include <hiredis/hiredis.h>
#include <hiredis/hiredis_ssl.h>
