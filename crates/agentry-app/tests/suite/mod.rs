mod follow;
