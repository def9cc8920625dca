#pragma once
#include <hiredis/hiredis.h>
