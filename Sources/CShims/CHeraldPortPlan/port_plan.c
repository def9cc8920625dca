// bind(2) interposed for herald-dev-broker: see include/CHeraldPortPlan.h.
#define _GNU_SOURCE
#include "CHeraldPortPlan.h"

#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_function)(int, const struct sockaddr *, socklen_t);

#define PLAN_MAX 64

static pthread_mutex_t plan_lock = PTHREAD_MUTEX_INITIALIZER;
static uint16_t plan_ports[PLAN_MAX];
static int plan_count;
static int plan_next;
static int plan_armed;
static long binds_seen;

static pthread_once_t real_bind_once = PTHREAD_ONCE_INIT;
static bind_function real_bind;

static void find_real_bind(void) { real_bind = (bind_function)dlsym(RTLD_NEXT, "bind"); }

int herald_port_plan_arm(const uint16_t *ports, int count) {
    if (count < 0 || count > PLAN_MAX) return -1;
    pthread_mutex_lock(&plan_lock);
    memcpy(plan_ports, ports, sizeof(uint16_t) * (size_t)count);
    plan_count = count;
    plan_next = 0;
    plan_armed = 1;
    pthread_mutex_unlock(&plan_lock);
    return 0;
}

int herald_port_plan_disarm(void) {
    pthread_mutex_lock(&plan_lock);
    int used = plan_next;
    plan_armed = 0;
    plan_count = 0;
    plan_next = 0;
    pthread_mutex_unlock(&plan_lock);
    return used;
}

long herald_port_plan_binds_seen(void) {
    pthread_mutex_lock(&plan_lock);
    long seen = binds_seen;
    pthread_mutex_unlock(&plan_lock);
    return seen;
}

int bind(int fd, const struct sockaddr *address, socklen_t length) {
    pthread_once(&real_bind_once, find_real_bind);
    if (real_bind == NULL) {
        errno = ENOSYS;
        return -1;
    }
    struct sockaddr_in in;
    int inet = address != NULL && length >= (socklen_t)sizeof(in) && address->sa_family == AF_INET;
    if (inet) memcpy(&in, address, sizeof(in));
    int planned = -1;
    pthread_mutex_lock(&plan_lock);
    binds_seen++;
    if (inet && in.sin_port == 0 && plan_armed && plan_next < plan_count) planned = plan_ports[plan_next++];
    pthread_mutex_unlock(&plan_lock);
    if (planned < 0) return real_bind(fd, address, length);
    in.sin_port = htons((uint16_t)planned);
    return real_bind(fd, (const struct sockaddr *)&in, (socklen_t)sizeof(in));
}
